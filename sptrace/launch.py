"""Launch the reference models on N local ranks with torchrun and collect their traces.

Runs are written into a staging folder and moved into place only when every rank succeeded,
so a failed or interrupted launch never leaves a half-written run (or destroys an old one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sptrace.errors import LaunchError, UsageError
from sptrace.profiling import RUN_FILE, trace_name
from sptrace.reference_models.config import StepConfig


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


def profile_reference(
    cfg: StepConfig,
    out_dir: Path,
    *,
    warmup: int = 2,
    device: str = "auto",
    force: bool = False,
    instrument: bool = True,
    lean: bool = False,
    log=None,
) -> ProfiledRun:
    """Profile one step of the reference model ``cfg`` on ``cfg.sp_size`` local ranks."""
    if warmup < 0:
        raise UsageError("--warmup must be >= 0")
    if lean and not instrument:
        raise UsageError("--lean needs the instrumentation: without python stacks or markers nothing names the modules")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and holds_run(out_dir) and not force:
        raise UsageError(f"{out_dir}: already holds a profiled run; pass --force to replace it")
    nproc = cfg.sp_size
    kind = pick_device(device, nproc)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "logs").mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "sptrace.reference_models.run", "--config", json.dumps(cfg.to_dict()), "--out", str(staging),
        "--warmup", str(warmup), "--device", kind, *([] if instrument else ["--no-instrument"]),
        *(["--lean"] if lean else []),
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share this machine's cores
    if log:
        backend = "NCCL" if kind == "cuda" else "gloo"
        log(f"profiling {cfg.scheme} on {nproc} ranks ({backend}, {kind}) -> {out_dir}")
    start = time.monotonic()
    launcher_log = staging / "logs" / "torchrun.log"
    try:
        with open(launcher_log, "wb") as sink:
            proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, check=False)
        if proc.returncode != 0:
            raise LaunchError(_failure_line(staging, out_dir, proc.returncode))
        missing = [trace_name(r) for r in range(nproc) if not (staging / trace_name(r)).exists()]
        if missing or not (staging / RUN_FILE).exists():
            raise LaunchError(f"{out_dir}: torchrun exited 0 but wrote no {', '.join(missing) or RUN_FILE}")
        _replace_run(staging, out_dir)
    except BaseException:
        _keep_logs(staging, out_dir)
        raise
    seconds = time.monotonic() - start
    size = sum(p.stat().st_size for p in out_dir.glob("rank*.pt.trace.json.gz"))
    return ProfiledRun(out_dir, nproc, kind, seconds, size)


def _failure_line(staging: Path, out_dir: Path, code: int) -> str:
    errors = sorted((staging / "logs").glob("rank*.error"), key=lambda p: int(p.stem[4:]))
    if errors:
        first = errors[0]
        msg = first.read_text().strip().splitlines()[0] if first.read_text().strip() else "failed"
        return f"profiling failed on {first.stem}: {msg} (traceback: {out_dir / 'logs' / (first.stem + '.traceback')})"
    return f"profiling failed: torchrun exited with {code} (log: {out_dir / 'logs' / 'torchrun.log'})"


def _keep_logs(staging: Path, out_dir: Path) -> None:
    """Move the failed launch's logs to OUT/logs for the user; drop its partial traces."""
    logs = staging / "logs"
    if logs.is_dir():
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
