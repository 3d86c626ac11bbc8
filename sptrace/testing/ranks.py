"""The ranks of ``sptrace.testing.check_sharding``: started as fresh interpreters, each in a process
session of its own, watched until every one has exited, and stopped together (SIGTERM, then SIGKILL
to each rank's whole process group) on any other outcome: a rank that raised or died of a signal,
a timeout, an interrupt. Each rank writes its output to ``logs/rank{r}.log``, and an exception
it raised, in one line with the user's source line, to ``logs/rank{r}.error``.

    python -c 'from sptrace.testing.ranks import main; main()' JOB.json RANK
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sptrace.testing import SptraceTestError

_STOP_GRACE_S = 3.0
_POLL_S = 0.05


def launch(root: Path, world: int, payload: bytes, timeout: float, options: dict[str, Any]) -> None:
    """Start the ranks, wait for every one to exit 0, and stop them all on any other outcome."""
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in logs.glob("rank*"):
        stale.unlink()
    store = logs / "store"
    store.unlink(missing_ok=True)
    job = logs / "job.pkl"
    job.write_bytes(payload)
    spec = {"run_dir": str(root), "logs": str(logs), "store": str(store), "job": str(job), "world_size": world,
            "timeout": timeout, **options}  # fmt: skip
    (logs / "job.json").write_text(json.dumps(spec))
    # SPTRACE_TESTING_RUN marks the ranks and whatever they start (a model can tell it runs here)
    env = dict(os.environ, PYTHONFAULTHANDLER="1", OMP_NUM_THREADS=str(options["threads"]), PYTHONUNBUFFERED="1",
               SPTRACE_TESTING_RUN=str(root))  # fmt: skip
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            with open(logs / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", "from sptrace.testing.ranks import main; main()",
                     str(logs / "job.json"), str(rank)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,  # the rank and what it starts: one group to stop
                ))  # fmt: skip
        deadline = time.monotonic() + timeout
        failed: dict[int, float] = {}  # rank -> when it was seen to fail
        while True:
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            for rank, code in enumerate(codes):
                if code not in (None, 0) and rank not in failed:
                    failed[rank] = time.time()
            if failed:
                raise SptraceTestError(_rank_failure(logs, procs, failed))
            if all(code == 0 for code in codes):
                break
            if now > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                raise SptraceTestError(
                    f"the ranks ran past the timeout of {timeout:g} s: rank{'s' if len(running) > 1 else ''} "
                    f"{', '.join(map(str, running))} still running, stopped; logs: {logs}/rank*.log"
                )
            time.sleep(_POLL_S)
    finally:
        _stop(procs)
    missing = [r for r in range(world) if not (root / f"rank{r}.pt.trace.json.gz").exists()]
    if missing:
        raise SptraceTestError(f"ranks {missing} exited 0 but wrote no trace into {root}; logs: {logs}/rank*.log")


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every rank still running (its whole process group), then SIGKILL what is left of
    each group, and reap every rank: nothing outlives the call."""
    posix = os.name == "posix"
    running = [p for p in procs if p.poll() is None]
    for p in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM) if posix else p.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:  # a group outlives its leader when the rank started children of its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL) if posix else p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def _rank_failure(logs: Path, procs: list[subprocess.Popen], failed: dict[int, float]) -> str:
    """One message for the first rank that failed: its exception and where, or its signal."""
    reports: list[tuple[float, int, str]] = []
    for rank in failed:
        error = logs / f"rank{rank}.error"
        if error.exists():
            try:
                data = json.loads(error.read_text())
            except ValueError:
                data = None
            if data:
                where = f" in {data['stage']}" if data.get("stage") else ""
                at = f" at {data['where']}" if data.get("where") else ""
                text = f"rank {rank} raised {data['error']}{where}{at}"
                reports.append((float(data.get("time", failed[rank])), rank, text))
                continue
        code = procs[rank].returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            text = f"rank {rank} died of signal {name}"
        else:
            text = f"rank {rank} exited with code {code} before it could say why"
        site = _crash_site(logs / f"rank{rank}.log")
        reports.append((failed[rank], rank, text + (f" {site}" if site else "")))
    _, rank, text = min(reports)
    others = [r for r in range(len(procs)) if r != rank]
    stopped = f"; the other ranks ({', '.join(map(str, others))}) were stopped" if others else ""
    return f"{text}{stopped}; its log: {logs}/rank{rank}.log"


def main() -> None:
    """One rank: ``python -c 'from sptrace.testing.ranks import main; main()' JOB RANK``."""
    job_path, rank = sys.argv[1], int(sys.argv[2])
    spec = json.loads(Path(job_path).read_text())
    logs = Path(spec["logs"])
    stage = "loading model_factory and step_fn"
    try:
        job = _load_job(Path(spec["job"]), spec["sys_path"], spec["main_path"])
        import torch
        import torch.distributed as dist

        import sptrace

        torch.set_num_threads(int(spec["threads"]))
        from datetime import timedelta

        stage = "init_process_group"
        dist.init_process_group(
            "gloo", init_method=f"file://{spec['store']}", rank=rank, world_size=int(spec["world_size"]),
            timeout=timedelta(seconds=float(spec["timeout"])),
        )  # fmt: skip
        stage = "model_factory"
        model = job["model_factory"](rank, int(spec["world_size"]))
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model_factory returned {type(model).__name__}, not an nn.Module")
        if spec["instrument"]:
            stage = "sptrace.instrument"
            sptrace.instrument(model)
        stage = "step_fn"
        step_fn = job["step_fn"]
        sptrace.profile_step(
            lambda i: step_fn(model, i), spec["run_dir"], warmup=int(spec["warmup"]), steps=int(spec["steps"]),
            run_info=spec["run_info"],
        )  # fmt: skip
        stage = "destroy_process_group"
        dist.destroy_process_group()
    except BaseException as exc:
        _report_error(logs, rank, stage, exc)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # never wait for peers still blocked in a collective: the parent stops them


def _load_job(path: Path, sys_path: list[str], main_path: str | None) -> dict[str, Callable[..., object]]:
    """The callables, unpickled once this process can import them: the parent's sys.path, and
    the user's script as ``__main__`` when they live there (as multiprocessing's spawn does)."""
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    if main_path:
        import runpy
        import types

        module = types.ModuleType("__mp_main__")
        module.__dict__.update(runpy.run_path(main_path, run_name="__mp_main__"))
        sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    return pickle.loads(path.read_bytes())


def _report_error(logs: Path, rank: int, stage: str, exc: BaseException) -> None:
    """rank{r}.error: the exception in one line, the stage, and the user's line (the innermost
    frame of the user's code); the whole traceback goes to the rank's log."""
    traceback.print_exc()
    frames = traceback.extract_tb(exc.__traceback__)
    where = _user_frame([(f.filename, f.lineno) for f in frames])
    message = str(exc).strip().splitlines()
    error = type(exc).__name__ + (f": {message[0]}" if message else "")
    data = {"rank": rank, "error": error, "stage": stage, "where": where, "time": time.time()}
    with contextlib.suppress(OSError):
        (logs / f"rank{rank}.error").write_text(json.dumps(data))


def _user_frame(frames: list[tuple[str, int | None]]) -> str | None:
    """``file:line`` of the innermost frame (frames outermost first) outside sptrace's own package
    and the installed libraries (torch, site-packages, the standard library); else of the innermost
    frame outside sptrace and torch (a framework's layer); None when there is none."""
    import sysconfig

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the sptrace package
    paths = sysconfig.get_paths()
    installed = tuple({os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})

    def not_ours(path: str) -> bool:
        full = os.path.abspath(path)
        return not full.startswith(ours) and f"{os.sep}torch{os.sep}" not in full and not path.startswith("<")

    for keep in (lambda path: not_ours(path) and not os.path.abspath(path).startswith(installed), not_ours):
        chosen = [(path, line) for path, line in frames if keep(path)]
        if chosen:
            return f"{chosen[-1][0]}:{chosen[-1][1]}"
    return None


_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>\S+)')


def _crash_site(log: Path) -> str:
    """Where a rank that died of a signal was, from faulthandler's dump in its log (the crashed
    thread's frames, most recent call first): the user's line, else the log's last line."""
    with contextlib.suppress(OSError):
        lines = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Current thread ")), None)
        frames: list[tuple[str, int | None]] = []
        for line in lines[start + 1 :] if start is not None else ():
            m = _FAULT_FRAME.match(line)
            if m is None:
                break
            frames.append((m["file"], int(m["line"])))
        where = _user_frame(list(reversed(frames)))
        if where:
            return f"at {where}"
        text = [line.strip() for line in lines if line.strip()]
        if text:
            return f"(its log ends: {text[-1]})"
    return ""
