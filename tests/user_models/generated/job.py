"""Profile every drawn model (draw.py) on 4 gloo ranks in one launch, the way a user profiles a
training run: plain torch.distributed collectives, torch.profiler with memory events and shapes,
prof.step() after each step; no sptrace code anywhere in the model or the step.

    python -m torch.distributed.run --standalone --nproc-per-node 4 \
        -m tests.user_models.generated.job --out DIR [--count N] [--seed K]

DIR/<draw>/rank{r}.json   the traces
DIR/truth/<draw>.json     the draw, where its stray went (the step number the profiler had,
                          the micro-batch, the layer), and torch's own record of it: a
                          saved_tensors_hooks census of the stray micro-batch (what autograd
                          saved of a full-sequence size) and the shapes the model held itself

The model: per layer, Megatron-style attention and MLP around a sequence all-gather and a
reduce-scatter; column-parallel linears save the sequence SHARD and gather it again in backward
(what keeps activations sharded); row-parallel outputs are reduce-scattered.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from tests.user_models.generated.draw import Draw, draws

STASH: list[Tensor] = []  # the "list" stray: a module appends the gathered sequence here


def gather_seq(x: Tensor, group: dist.ProcessGroup, dim: int) -> Tensor:
    """This rank's sequence shard -> the whole sequence, along ``dim``."""
    p = dist.get_world_size(group)
    if dim == 0:
        out = torch.empty((p * x.shape[0], *x.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out
    pieces = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def scatter_seq(x: Tensor, group: dist.ProcessGroup, dim: int) -> Tensor:
    """Sum over the group and keep this rank's sequence shard along ``dim``."""
    p = dist.get_world_size(group)
    full = x.movedim(dim, 0).contiguous()
    out = torch.empty((full.shape[0] // p, *full.shape[1:]), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, full, group=group)
    return out.movedim(0, dim)


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup, dim: int) -> Tensor:
        ctx.group, ctx.dim = group, dim
        return gather_seq(x, group, dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return scatter_seq(grad, ctx.group, ctx.dim), None, None


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup, dim: int) -> Tensor:
        ctx.group, ctx.dim = group, dim
        return scatter_seq(x, group, dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return gather_seq(grad, ctx.group, ctx.dim), None, None


class ColumnParallel(torch.autograd.Function):
    """Gather the shard, multiply by this rank's weight rows; save the shard, gather it again in
    backward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, group: dist.ProcessGroup, dim: int) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.dim = group, dim
        return F.linear(gather_seq(x, group, dim), weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        full = gather_seq(x, ctx.group, ctx.dim)
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        return scatter_seq(grad @ weight, ctx.group, ctx.dim), grad_weight, None, None


class Probe(nn.Module):
    """Gathers the sequence outside autograd (a user's debugging view of the whole activation)."""

    def __init__(self, group: dist.ProcessGroup, dim: int) -> None:
        super().__init__()
        self.group, self.dim = group, dim

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            return gather_seq(x, self.group, self.dim)


@torch.compile(dynamic=True)
def compiled_block(t: Tensor, scale: Tensor) -> Tensor:
    """A fused elementwise block: its backward needs t and sin's input, which inductor saves."""
    return (t * scale).sin() + t


class Layer(nn.Module):
    def __init__(self, d: Draw, group: dist.ProcessGroup) -> None:
        super().__init__()
        p = d.sp
        self.d, self.group = d, group
        self.dim = 1 if d.layout == "bsh" else 0  # the sequence axis
        self.local_heads = d.heads // p
        width = self.local_heads * d.head_dim
        self.attn_norm = nn.LayerNorm(d.hidden)
        self.wqkv = nn.Parameter(torch.randn(3 * width, d.hidden) / d.hidden**0.5)
        self.wo = nn.Parameter(torch.randn(d.hidden, width) / width**0.5)
        self.mlp_norm = nn.LayerNorm(d.hidden)
        self.fc1 = nn.Parameter(torch.randn(d.ffn // p, d.hidden) / d.hidden**0.5)
        self.fc2 = nn.Parameter(torch.randn(d.hidden, d.ffn // p) / (d.ffn // p) ** 0.5)
        self.scale = nn.Parameter(torch.ones(d.hidden))
        self.probe = Probe(group, self.dim)
        self.cache: Tensor | None = None
        self.stray: str | None = None  # the way this forward keeps a stray, when it does

    def attention(self, x: Tensor) -> Tensor:
        qkv = ColumnParallel.apply(self.attn_norm(x), self.wqkv, self.group, self.dim)
        if self.dim == 0:
            qkv = qkv.transpose(0, 1)  # [B, S, 3w]
        b, s, _ = qkv.shape
        q, k, v = qkv.view(b, s, 3, self.local_heads, self.d.head_dim).permute(2, 0, 3, 1, 4)  # [B, a/P, S, d]
        probs = (q @ k.transpose(-1, -2) / math.sqrt(self.d.head_dim)).softmax(-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        if self.dim == 0:
            ctx = ctx.transpose(0, 1)
        return Scatter.apply(F.linear(ctx, self.wo), self.group, self.dim)

    def mlp(self, x: Tensor) -> Tensor:
        h = self.mlp_norm(x)
        way = self.stray
        if way == "autograd":  # a plain linear on the gathered input: autograd saves it whole
            up = F.linear(Gather.apply(h, self.group, self.dim), self.fc1)
        else:
            up = ColumnParallel.apply(h, self.fc1, self.group, self.dim)
        if way in ("list", "attr", "hook"):
            full = self.probe(h)  # the hook way: a forward hook on probe keeps it (see Model)
            if way == "list":
                STASH.append(full)
            elif way == "attr":
                self.cache = full
        if way == "compile":  # the compiled block moved inside the gathered region
            full = Gather.apply(h, self.group, self.dim)
            up = up + F.linear(compiled_block(full, self.scale), self.fc1)
        return Scatter.apply(F.linear(F.gelu(up), self.fc2), self.group, self.dim)

    def block(self, x: Tensor) -> Tensor:
        x = x + self.attention(x)
        if self.d.compiled:
            x = compiled_block(x, self.scale)  # on the shard: sharded saves
        return x + self.mlp(x)

    def forward(self, x: Tensor) -> Tensor:
        if not self.d.checkpointed:
            return self.block(x)
        return checkpoint(self.block_sac, x, use_reentrant=False, context_fn=partial(
            create_selective_checkpoint_contexts, self.policy))  # fmt: skip

    def block_sac(self, x: Tensor) -> Tensor:
        """The block with its gathers as functional collectives, which a SAC policy can see."""
        h = self.attn_norm(x)
        full = funcol.all_gather_tensor_autograd(h.movedim(self.dim, 0).contiguous(), 0, self.group).movedim(
            0, self.dim
        )
        qkv = F.linear(full, self.wqkv)
        if self.dim == 0:
            qkv = qkv.transpose(0, 1)
        b, s, _ = qkv.shape
        q, k, v = qkv.view(b, s, 3, self.local_heads, self.d.head_dim).permute(2, 0, 3, 1, 4)
        ctx = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
        if self.dim == 0:
            ctx = ctx.transpose(0, 1)
        part = F.linear(ctx, self.wo).movedim(self.dim, 0).contiguous()
        x = x + funcol.reduce_scatter_tensor_autograd(part, "sum", 0, self.group).movedim(0, self.dim)
        h = self.mlp_norm(x)
        full = funcol.all_gather_tensor_autograd(h.movedim(self.dim, 0).contiguous(), 0, self.group).movedim(
            0, self.dim
        )
        part = F.linear(F.gelu(F.linear(full, self.fc1)), self.fc2).movedim(self.dim, 0).contiguous()
        return x + funcol.reduce_scatter_tensor_autograd(part, "sum", 0, self.group).movedim(0, self.dim)

    def policy(self, ctx, op, *args, **kwargs):
        """Keep the column-parallel and attention matmul outputs (sharded: [.., S, w/P]);
        recompute everything else, the gathers included. The stray: MUST_SAVE the all-gather's
        output as well."""
        name = str(op)
        # a row-parallel product (wo, fc2) is a full-size partial sum until its reduce-scatter
        row = (
            name.startswith("aten.mm")
            and len(args) > 1
            and any(args[1] is w or getattr(args[1], "_base", None) is w for w in (self.wo, self.fc2))
        )
        keep = ("mm" in name and not row) or (self.stray == "sac" and ("all_gather" in name or "wait_tensor" in name))
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


class Model(nn.Module):
    def __init__(self, d: Draw, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, group) for _ in range(d.layers))
        self.kept: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers):
            layer.probe.register_forward_hook(partial(self._keep, i))

    def _keep(self, i: int, module: nn.Module, args: Any, output: Tensor) -> None:
        if self.layers[i].stray == "hook":
            self.kept[f"layers.{i}"] = output

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def census(model: Model, run) -> list[list[int]]:
    """Shapes of what autograd saves during ``run`` that span the whole sequence at H or wider."""
    shapes: list[list[int]] = []

    def pack(t: Tensor) -> Tensor:
        shapes.append(list(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    loss.backward()
    return shapes


def run_draw(d: Draw, groups: dict[int, dist.ProcessGroup], root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    group = groups[d.sp]
    dtype = getattr(torch, d.dtype)
    torch.manual_seed(1000 + int(d.name[1:]))
    model = Model(d, group).to(dtype)
    local = (d.batch, d.seq // d.sp, d.hidden) if d.layout == "bsh" else (d.seq // d.sp, d.batch, d.hidden)
    xs = [torch.randn(local, dtype=dtype) for _ in range(d.micro_batches)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    stray = d.stray or {}
    truth: dict[str, Any] = {"draw": d.to_dict(), "stray": None, "world": world}

    def set_stray(step: int | None, mb: int) -> None:
        for i, layer in enumerate(model.layers):
            hit = stray and step == stray["step"] and mb == stray["micro_batch"] and i == stray["layer"]
            layer.stray = stray["way"] if hit else None

    def train_step(step: int | None, prof=None) -> None:
        losses = []
        for mb, x in enumerate(xs):
            set_stray(step, mb)
            if step is not None and stray and layer_hit(step, mb) and prof is not None:
                truth["stray"] = {**stray, "profiler_step": prof.step_num}
            loss = model(x).float().square().mean() / len(xs)
            if d.order == "interleaved":
                loss.backward()
            else:
                losses.append(loss)
        for loss in losses:  # grouped: f0 f1 ... then b0 b1 ...
            loss.backward()
        set_stray(None, -1)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def layer_hit(step: int, mb: int) -> bool:
        return step == stray["step"] and mb == stray["micro_batch"]

    train_step(None)  # warm-up (and the compile, for compiled draws)
    if stray:  # torch's own view of the stray micro-batch: autograd's saves, and what is held
        set_stray(stray["step"], stray["micro_batch"])
        saved = census(model, lambda: model(xs[stray["micro_batch"]]).float().square().mean())
        held = [list(t.shape) for t in [*STASH, *model.kept.values()]] + [
            list(layer.cache.shape) for layer in model.layers if layer.cache is not None
        ]
        set_stray(None, -1)
        truth["census"] = {"saved": saved, "held": held}
        STASH.clear()
        model.kept.clear()
        for layer in model.layers:
            layer.cache = None
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
        schedule=schedule(wait=0, warmup=1, active=d.steps, repeat=1),
    ) as prof:  # fmt: skip
        train_step(None, prof)  # the profiler's warm-up step
        prof.step()
        for step in range(d.steps):
            train_step(step, prof)
            prof.step()
        # the list, the attribute and the hook keep their tensor past the profiled window
    out = root / d.name
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    STASH.clear()
    if rank == 0:
        (root / "truth").mkdir(exist_ok=True)
        (root / "truth" / f"{d.name}.json").write_text(json.dumps(truth, indent=1))
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, help="default: SPTRACE_GENERATED_DRAWS, else 24 (draw.default_count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    # every rank takes part in creating every group; P = 2 is two groups of consecutive ranks
    groups = {world: dist.group.WORLD}
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
    groups[2] = pairs[rank // 2]
    root = Path(args.out)
    chosen = [d for d in draws(args.count, args.seed) if not args.only or d.name in args.only]
    if any(d.compiled for d in chosen):  # rank 0 compiles first; the others read its cache
        if rank == 0:
            compiled_block(torch.ones(2, 3, 4, requires_grad=True), torch.ones(4, requires_grad=True)).sum().backward()
        dist.barrier()
        if rank:
            compiled_block(torch.ones(2, 3, 4, requires_grad=True), torch.ones(4, requires_grad=True)).sum().backward()
    try:
        for d in chosen:
            run_draw(d, groups, root)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        (root / "done").write_text("ok\n")


if __name__ == "__main__":
    main()
