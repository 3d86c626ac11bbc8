"""The ranks of a profiled reference-model launch; ``sptrace profile`` starts them with torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node P -m sptrace.reference_models.run \\
        --plan PLAN.json

PLAN.json lists the runs of the launch, profiled one after the other in the same processes (an
8-rank launch on a small machine spends most of its time importing torch eight times, so many
configurations share one launch): ``{"warmup": 2, "steps": 2, "device": "cpu", "runs": [{"config": {...},
"out": DIR, "instrument": true, "lean": false}, ...]}``. Each run is written to its own DIR exactly
as a launch of that run alone would write it. On failure the rank writes ``DIR/logs/rank{r}.error``
(one line) of the run it was in, for the launcher to report, and stops: the runs before it stand.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import shard_of_step, step_batch, step_loss, torch_dtype
from sptrace.reference_models.model import build_model
from sptrace.reference_models.ring import release_subgroups

import sptrace


def run_rank(
    cfg: StepConfig,
    out: Path,
    warmup: int,
    device_kind: str,
    instrument: bool = True,
    lean: bool = False,
    steps: int = 2,
) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    if device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    model = build_model(cfg, dist.group.WORLD, device, comm_markers=instrument)
    if instrument:  # after fully_shard, so FSDP2's gathers fall inside module ranges
        sptrace.instrument(model)
    phase = sptrace.phase if instrument else (lambda name: contextlib.nullcontext())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x_full, target_full = step_batch(cfg)
    x = shard_of_step(x_full, cfg, rank, world).to(device=device, dtype=torch_dtype(cfg))  # [B, S/P, H]
    target = shard_of_step(target_full, cfg, rank, world).to(device=device, dtype=torch_dtype(cfg))

    def train_step(step: int) -> None:
        with phase("forward"):
            loss = step_loss(model(x), target, cfg)
        with phase("backward"):
            loss.backward()
            model.finish_grad_sync()
        with phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.end_step()

    run_info = {
        **cfg.to_dict(),
        "reference_model": True,
        "fault_modules": model.fault_modules,
        "layout": "batch-first",
        "instrumented": instrument,
    }
    sptrace.profile_step(train_step, out, warmup=warmup, steps=steps, run_info=run_info, lean=lean)


def run_plan(plan: dict, rank: int) -> None:
    """Profile each run of ``plan`` in turn. Nothing of one run outlives it: its model, optimizer
    and their tensors are collected before the next starts, so no free of theirs falls into the
    next run's profiled step."""
    warmup, device, steps = int(plan.get("warmup", 2)), plan.get("device", "cpu"), int(plan.get("steps", 2))
    for item in plan["runs"]:
        out = Path(item["out"])
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            cfg = StepConfig.from_dict(item["config"])
            if dist.get_world_size() != cfg.sp_size:
                raise ValueError(f"world size {dist.get_world_size()} != sp_size {cfg.sp_size}")
            start = time.monotonic()
            run_rank(
                cfg,
                out,
                warmup,
                device,
                instrument=item.get("instrument", True),
                lean=item.get("lean", False),
                steps=steps,
            )
            gc.collect()
            dist.barrier()
            release_subgroups()
            if rank == 0:  # what this run alone took, imports and rendezvous excluded
                (logs / "seconds").write_text(f"{time.monotonic() - start:.3f}\n")
        except BaseException as exc:
            (logs / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}\n")
            (logs / f"rank{rank}.traceback").write_text(traceback.format_exc())
            raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plan", required=True, help="the runs of this launch, as JSON (see above)")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    plan = json.loads(Path(args.plan).read_text())
    backend = "nccl" if plan.get("device") == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
    except BaseException as exc:  # before any run: the first run's logs say why
        logs = Path(plan["runs"][0]["out"]) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}\n")
        (logs / f"rank{rank}.traceback").write_text(traceback.format_exc())
        raise
    run_plan(plan, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
