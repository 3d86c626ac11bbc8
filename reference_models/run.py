"""One rank of a profiled reference-model step; ``sptrace profile`` launches it with torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node P -m sptrace.reference_models.run \\
        --config '{"scheme": "megatron", ...}' --out DIR

On failure the rank writes ``DIR/logs/rank{r}.error`` (one line) for the launcher to report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import shard_of_step, step_batch, step_loss, torch_dtype
from sptrace.reference_models.model import build_model

import sptrace


def run_rank(
    cfg: StepConfig, out: Path, warmup: int, device_kind: str, instrument: bool = True, lean: bool = False
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
    sptrace.profile_step(train_step, out, warmup=warmup, run_info=run_info, lean=lean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="StepConfig as JSON")
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-instrument", action="store_true", help="no sptrace markers or saved-tensor records")
    parser.add_argument("--lean", action="store_true", help="profile without Python stacks")
    args = parser.parse_args()
    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = StepConfig.from_dict(json.loads(args.config))
        backend = "nccl" if args.device == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
        if dist.get_world_size() != cfg.sp_size:
            raise ValueError(f"world size {dist.get_world_size()} != sp_size {cfg.sp_size}")
        run_rank(cfg, out, args.warmup, args.device, instrument=not args.no_instrument, lean=args.lean)
        dist.destroy_process_group()
    except BaseException as exc:
        (logs / f"rank{rank}.error").write_text(f"{type(exc).__name__}: {exc}\n")
        (logs / f"rank{rank}.traceback").write_text(traceback.format_exc())
        raise


if __name__ == "__main__":
    main()
