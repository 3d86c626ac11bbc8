"""Profile training steps on every rank: ``profile_step`` runs warm-up steps, then two steps (by
default) under ``torch.profiler`` with the settings sptrace's analyses need (record_shapes,
profile_memory, with_stack), and writes ``rank{r}.pt.trace.json.gz`` plus, on rank 0,
``run.json`` with what the user declares about the run (scheme, B, S, H, heads, P ...). The second
step decides what one alone cannot: a collective's buffer that the backend released on its own
thread (no free in the trace) is usually allocated again in the next step."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

import sptrace
from sptrace.fileio import write_atomic

RUN_SCHEMA = 1


def trace_name(rank: int) -> str:
    return f"rank{rank}.pt.trace.json.gz"


def _export_trace(prof: profile, path: Path) -> None:
    fd, tmp_json = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp_json)
        with open(tmp_json, "rb") as src:
            gz_tmp = tmp_json + ".gz"
            with gzip.open(gz_tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(gz_tmp, path)
    finally:
        Path(tmp_json).unlink(missing_ok=True)
        Path(tmp_json + ".gz").unlink(missing_ok=True)


def profile_step(
    step_fn: Callable[[int], object],
    out_dir: str | os.PathLike[str],
    *,
    warmup: int = 2,
    steps: int = 2,
    run_info: Mapping[str, object] | None = None,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = True,
    activities: list[ProfilerActivity] | None = None,
    lean: bool = False,
) -> Path:
    """Run ``step_fn(i)`` for ``warmup`` steps, then profile ``steps`` more (each in its own
    ``ProfilerStep#i`` range; ``sptrace check`` judges every one) and export them.

    ``step_fn`` runs one whole training step; mark its phases with ``sptrace.phase(...)``.
    Call it on every rank (torch.distributed initialised, or a single process). Returns this
    rank's trace path. ``run_info`` (JSON-serialisable) is recorded in ``out_dir/run.json``
    under "config": what the analyses know about the model (scheme, sp_size, layers, batch, seq,
    hidden, heads, kv_heads, ffn, dtype). Nothing left out is guessed: ``sptrace check`` needs
    batch, seq, hidden and sp_size, ``sptrace analyze`` every value and the scheme.

    ``lean``: no Python stacks, the profiler's costliest option. Module attribution then comes
    from ``sptrace.instrument``'s markers alone, which the sharding check and the collectives'
    layers need: profile an instrumented model.
    """
    if lean:
        with_stack = False
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    if activities is None:
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)

    for i in range(warmup):
        step_fn(i)
    _sync(distributed)
    with profile(
        activities=activities,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    ) as prof:
        for k in range(warmup, warmup + steps):
            with record_function(f"ProfilerStep#{k}"):  # the name HTA and TensorBoard expect
                step_fn(k)
            _sync(distributed, barrier=False)
    path = out / trace_name(rank)
    _export_trace(prof, path)
    if rank == 0:
        # (imported here, on rank 0 alone: the loader brings pyarrow, which training has no other use for)
        from sptrace.load.files import RUN_FILE

        info = {
            "schema": RUN_SCHEMA,
            "sptrace_version": sptrace.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": socket.gethostname(),
            "world_size": world_size,
            "backend": dist.get_backend() if distributed else None,
            "device": "cuda" if ProfilerActivity.CUDA in activities else "cpu",
            "torch_version": torch.__version__,
            "profiled_step": warmup,
            "profiled_steps": list(range(warmup, warmup + steps)),
            "traces": [trace_name(r) for r in range(world_size)],
            "profiler": {
                "record_shapes": record_shapes,
                "profile_memory": profile_memory,
                "with_stack": with_stack,
            },
            "config": dict(run_info or {}),
        }
        write_atomic(out / RUN_FILE, (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    _sync(distributed)
    return path


def _sync(distributed: bool, barrier: bool = True) -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    if distributed and barrier:
        dist.barrier()
