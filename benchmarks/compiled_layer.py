"""A sequence-parallel layer compiled whole by torch.compile (inductor), on 2 gloo ranks: the
gather is a functional collective inside the compiled graph, and AOTAutograd decides what to
save. Profiles one step of two layers:
  regather  a custom op that saves the shard and gathers it again in backward, as Megatron does
            eagerly; compiled, AOTAutograd moves the backward's gather into forward and saves
            its full output: a full-size save the user never wrote;
  stray     a plain linear of the gathered input, whose weight gradient needs it whole.
Both keep a full [S, B, H] buffer for backward, and `sptrace check` must FAIL both:

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/compiled_layer.py --out /tmp/comp
    sptrace check /tmp/comp/regather --batch 2 --seq 64 --hidden 64 --sp 2
    sptrace check /tmp/comp/stray --batch 2 --seq 64 --hidden 64 --sp 2

The compiled graph's buffers are inductor's: their [memory] events have no op with shapes around
them, so only their origin (the functional all-gather that filled them) or their size can
judge them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

B, S, H, F_ = 2, 64, 64, 128


class _GatherLinear(torch.autograd.Function):
    """Saves the shard and gathers it again in backward (what keeps activations sharded)."""

    @staticmethod
    def forward(ctx, x, w, group):
        ctx.save_for_backward(x, w)
        ctx.group = group
        return F.linear(funcol.all_gather_tensor(x, 0, group), w)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        full = funcol.all_gather_tensor(x, 0, ctx.group)
        gw = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        gx = funcol.reduce_scatter_tensor(grad @ w, "sum", 0, ctx.group)
        return gx, gw, None


def layer(x, w1, w2, group, stray: bool):
    h = F.layer_norm(x, x.shape[-1:])
    if stray:  # a plain linear of the gathered input: its weight gradient needs it whole
        up = F.linear(funcol.all_gather_tensor_autograd(h, 0, group), w1)
    else:
        up = _GatherLinear.apply(h, w1, group)
    out = F.linear(F.gelu(up), w2)  # [S, B, H] partial sums
    return x + funcol.reduce_scatter_tensor_autograd(out, "sum", 0, group)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch.manual_seed(0)
    w1 = torch.randn(F_ // world, H, requires_grad=True)
    w2 = torch.randn(H, F_ // world, requires_grad=True)
    x = torch.randn(S // world, B, H)  # sequence-first, as Megatron is
    for name, stray in (("regather", False), ("stray", True)):
        step = torch.compile(lambda x, stray=stray: layer(x, w1, w2, group, stray))
        for _ in range(2):
            step(x).square().mean().backward()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True) as p:
            step(x).square().mean().backward()
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        p.export_chrome_trace(str(out / f"rank{rank}.json"))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
