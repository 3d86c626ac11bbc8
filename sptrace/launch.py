"""Launch the reference models on N local ranks with torchrun and collect their traces.

Runs are written into a staging folder and moved into place only when every rank succeeded,
so a failed or interrupted launch never leaves a half-written run (or destroys an old one)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sptrace.load.files import RUN_FILE
from sptrace.profiling import trace_name
from sptrace.reference_models.config import StepConfig
from sptrace.vocab.errors import LaunchError, UsageError


@dataclass(frozen=True, slots=True)
class ProfiledRun:
    out_dir: Path
    world_size: int
    device: str
    seconds: float
    trace_bytes: int


def pick_device(requested: str, nproc: int) -> str:
    """'auto': CUDA (NCCL) when this machine has at least ``nproc`` GPUs, else CPU (gloo)."""
    if requested == "cpu":
        return "cpu"
    import torch  # deferred: flag errors are reported before paying for the import

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cuda" and gpus < nproc:
        raise UsageError(f"--device cuda needs {nproc} GPUs, this machine has {gpus}")
    return "cuda" if gpus >= nproc else "cpu"


def holds_run(path: Path) -> bool:
    return (path / RUN_FILE).exists() or any(path.glob("rank*.pt.trace.json*"))


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One run of a launch: the model configuration and the folder it is written to."""

    cfg: StepConfig
    out_dir: Path
    instrument: bool = True
    lean: bool = False


def profile_reference(
    cfg: StepConfig,
    out_dir: Path,
    *,
    warmup: int = 2,
    steps: int = 2,
    device: str = "auto",
    force: bool = False,
    instrument: bool = True,
    lean: bool = False,
    log=None,
) -> ProfiledRun:
    """Profile ``steps`` steps of the reference model ``cfg`` on ``cfg.sp_size`` local ranks."""
    (run,) = profile_references([RunRequest(cfg, out_dir, instrument, lean)], warmup=warmup, steps=steps,
                                device=device, force=force, log=log)  # fmt: skip
    return run


def _check_request(req: RunRequest, force: bool) -> None:
    if req.lean and not req.instrument:
        raise UsageError("--lean needs the instrumentation: without python stacks or markers nothing names the modules")
    if req.out_dir.exists() and not req.out_dir.is_dir():
        raise UsageError(f"{req.out_dir}: exists and is not a directory")
    if req.out_dir.is_dir() and holds_run(req.out_dir) and not force:
        raise UsageError(f"{req.out_dir}: already holds a profiled run; pass --force to replace it")


def check_requests(requests: list[RunRequest], *, warmup: int, force: bool, steps: int = 2) -> None:
    """What ``profile_references`` checks before it launches: one rank count, one folder per
    run, no run replaced without ``force``."""
    if warmup < 0:
        raise UsageError("--warmup must be >= 0")
    if steps < 1:
        raise UsageError("--steps must be >= 1")
    sizes = sorted({r.cfg.sp_size for r in requests})
    if len(sizes) > 1:
        raise UsageError(f"one launch runs one rank count; these runs ask for {', '.join(map(str, sizes))}")
    folders = [r.out_dir.resolve() for r in requests]
    twice = sorted({str(f) for f in folders if folders.count(f) > 1})
    if twice:
        raise UsageError(f"two runs of one launch would write {twice[0]}")
    for req in requests:
        _check_request(req, force)


def profile_references(
    requests: list[RunRequest],
    *,
    warmup: int = 2,
    steps: int = 2,
    device: str = "auto",
    force: bool = False,
    log=None,
) -> list[ProfiledRun]:
    """Profile several runs of the same rank count in ONE torchrun launch: the ranks import torch
    and meet once, then profile each run in turn (reference_models/run.py). Each run is written
    to its own folder, as a launch of that run alone would write it. Every request is checked
    before anything launches. When a rank fails, the runs that finished before it are kept, the
    failed and the unstarted ones leave their folders as they were, and the error names the run."""
    if not requests:
        return []
    check_requests(requests, warmup=warmup, force=force, steps=steps)
    nproc = requests[0].cfg.sp_size
    kind = pick_device(device, nproc)
    stagings = []
    for req in requests:
        req.out_dir.mkdir(parents=True, exist_ok=True)
        staging = req.out_dir / f".staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "logs").mkdir(parents=True)
        stagings.append(staging)
    plan = {
        "warmup": warmup,
        "steps": steps,
        "device": kind,
        "runs": [
            {"config": r.cfg.to_dict(), "out": str(st), "instrument": r.instrument, "lean": r.lean}
            for r, st in zip(requests, stagings)
        ],
    }
    plan_file = stagings[0] / "logs" / "plan.json"
    plan_file.write_text(json.dumps(plan, indent=1))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "sptrace.reference_models.run", "--plan", str(plan_file),
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share this machine's cores
    if log:
        backend = "NCCL" if kind == "cuda" else "gloo"
        what = requests[0].cfg.scheme if len(requests) == 1 else f"{len(requests)} runs"
        target = requests[0].out_dir if len(requests) == 1 else _common_parent(requests)
        log(f"profiling {what} on {nproc} ranks ({backend}, {kind}) -> {target}")
    start = time.monotonic()
    launcher_log = stagings[0] / "logs" / "torchrun.log"
    done: list[ProfiledRun] = []
    failure: str | None = None
    try:
        with open(launcher_log, "wb") as sink:
            proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, check=False)
        plan_file.unlink(missing_ok=True)  # (it names the staging folders)
        for staging in stagings[1:]:  # every run's logs hold the launch's log, as a launch of its own would
            if launcher_log.exists():
                shutil.copyfile(launcher_log, staging / "logs" / "torchrun.log")
        for i, (req, staging) in enumerate(zip(requests, stagings)):
            missing = [trace_name(r) for r in range(nproc) if not (staging / trace_name(r)).exists()]
            if missing or not (staging / RUN_FILE).exists():
                if proc.returncode != 0:
                    failure = _failure_line(staging, req.out_dir, proc.returncode, requests[0].out_dir)
                else:
                    failure = f"{req.out_dir}: torchrun exited 0 but wrote no {', '.join(missing) or RUN_FILE}"
                if len(requests) > 1:
                    failure += f"; {i} of {len(requests)} runs were written"
                break
            seconds = _run_seconds(staging, time.monotonic() - start if len(requests) == 1 else None)
            _replace_run(staging, req.out_dir)
            size = sum(p.stat().st_size for p in req.out_dir.glob("rank*.pt.trace.json.gz"))
            done.append(ProfiledRun(req.out_dir, nproc, kind, seconds, size))
        else:
            if proc.returncode != 0:
                failure = f"profiling failed: torchrun exited with {proc.returncode} after writing every run"
    finally:
        for req, staging in zip(requests[len(done) :], stagings[len(done) :]):
            if staging.exists():
                _keep_logs(staging, req.out_dir, keep=staging is stagings[len(done)] or staging is stagings[0])
            with contextlib.suppress(OSError):  # a folder this launch made and left empty goes too
                req.out_dir.rmdir()
    if failure:
        raise LaunchError(failure)
    return done


def _common_parent(requests: list[RunRequest]) -> Path:
    parents = {r.out_dir.parent for r in requests}
    return parents.pop() if len(parents) == 1 else Path(os.path.commonpath([str(r.out_dir) for r in requests]))


def _run_seconds(staging: Path, fallback: float | None) -> float:
    """What the run took on rank 0 (reference_models/run.py writes it); the launch's wall time
    when the run is alone in it."""
    if fallback is not None:
        return fallback
    try:
        return float((staging / "logs" / "seconds").read_text())
    except (OSError, ValueError):
        return float("nan")


def _failure_line(staging: Path, out_dir: Path, code: int, log_dir: Path) -> str:
    errors = sorted((staging / "logs").glob("rank*.error"), key=lambda p: int(p.stem[4:]))
    if errors:
        first = errors[0]
        msg = first.read_text().strip().splitlines()[0] if first.read_text().strip() else "failed"
        return f"profiling failed on {first.stem}: {msg} (traceback: {out_dir / 'logs' / (first.stem + '.traceback')})"
    return f"profiling failed: torchrun exited with {code} (log: {log_dir / 'logs' / 'torchrun.log'})"


def _keep_logs(staging: Path, out_dir: Path, keep: bool = True) -> None:
    """Move the failed launch's logs to OUT/logs for the user; drop its partial traces."""
    logs = staging / "logs"
    if keep and logs.is_dir():
        dest = out_dir / "logs"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.move(str(logs), str(dest))
    shutil.rmtree(staging, ignore_errors=True)


def _replace_run(staging: Path, out_dir: Path) -> None:
    for old in [*out_dir.glob("rank*.pt.trace.json*"), out_dir / RUN_FILE]:
        old.unlink(missing_ok=True)
    shutil.rmtree(out_dir / "logs", ignore_errors=True)
    # run.json last: a folder with run.json is a complete run
    for item in sorted(staging.iterdir(), key=lambda p: p.name == RUN_FILE):
        os.replace(item, out_dir / item.name)
    staging.rmdir()
