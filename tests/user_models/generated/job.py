"""Profile every drawn model (draw.py) on 8 gloo ranks in one launch, the way a user profiles a
training run: plain torch.distributed collectives (or functional ones), torch.profiler with
memory events and shapes, prof.step() after each step; where the draw follows the README's recipe,
sptrace.instrument and sptrace.profile_step instead (which writes run.json beside the traces).

    python -m torch.distributed.run --standalone --nproc-per-node 8 \\
        -m tests.user_models.generated.job --out DIR [--count N] [--seed K] [--only gNN ...]

DIR/<draw>/rank{r}.json   the traces (an instrumented draw's: rank{r}.pt.trace.json.gz and run.json,
                          as sptrace.profile_step writes them)
DIR/truth/<draw>.json     the draw and torch's own record of it, per rank: the planted tensor's
                          storage (pointer, elements), whether it was alive at the forward ->
                          backward boundary of its micro-batch (a weak reference to its storage,
                          read there), whether it is a buffer a collective filled or returned
                          (the only tensors a backend can hold), the profiler's step number when
                          it ran, and every buffer a collective filled that was still alive at a
                          boundary

The model: per layer, Megatron-style attention and MLP around a sequence all-gather and a
return of partial sums to shards; column-parallel linears save the sequence SHARD and gather it
again in backward (what keeps activations sharded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import weakref
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


class Truth:
    """Torch's record of a draw on this rank: the planted tensor and the collectives' buffers."""

    def __init__(self) -> None:
        self.recording = False
        self.buffers: list[tuple[Any, int, int]] = []  # (weakref to a collective's buffer's storage, ptr, micro-batch)
        self.micro_batch = -1
        self.plant: Any = None
        self.plant_info: dict | None = None
        self.in_backward = False  # a checkpoint's recomputation plants nothing: the forward did
        self.offload_source: int | None = None  # the offload stray: the storage whose saved copy is the plant

    def collective_buffer(self, t: Tensor) -> Tensor:
        """A buffer a collective filled or returned (the only tensors a backend can hold)."""
        if self.recording:
            storage = _storage(t)
            self.buffers.append((weakref.ref(storage), storage.data_ptr(), self.micro_batch))
        return t

    def planted(self, t: Tensor) -> None:
        if self.in_backward:
            return
        storage = _storage(t)
        ptrs = {ptr for _, ptr, _ in self.buffers}
        self.plant = weakref.ref(storage)
        self.plant_info = {"ptr": storage.data_ptr(), "bytes": storage.nbytes(), "shape": list(t.shape),
                           "numel": t.numel(), "collective_buffer": storage.data_ptr() in ptrs}  # fmt: skip

    def alive(self) -> list[int]:
        """The pointers of the collectives' buffers of this micro-batch still alive."""
        return [ptr for ref, ptr, mb in self.buffers if mb == self.micro_batch and ref() is not None]


TRUTH = Truth()


def _storage(t: Tensor) -> torch.UntypedStorage:
    return getattr(t, "elem", t).untyped_storage()  # an AsyncCollectiveTensor wraps its result


# ---- collectives, in the forms users write -----------------------------------------------------


def gather_seq(x: Tensor, group: dist.ProcessGroup, dim: int, form: str) -> Tensor:
    """This rank's sequence shard -> the whole sequence, along ``dim``."""
    p = dist.get_world_size(group)
    if form == "list":  # the pieces are the backend's; their cat is the model's own tensor
        pieces = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)
    if form in ("allreduce_pad", "broadcast", "ring"):
        return assemble_seq(x, group, dim, form)
    xs = x.movedim(dim, 0).contiguous()
    if form == "funcol":
        out = funcol.all_gather_tensor(xs, 0, group)
        out = out.wait() if hasattr(out, "wait") else out
    else:  # into_tensor: a buffer the model made, filled by the collective
        out = torch.empty((p * xs.shape[0], *xs.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(out, xs, group=group)
    return TRUTH.collective_buffer(out).movedim(0, dim)


def assemble_seq(x: Tensor, group: dist.ProcessGroup, dim: int, form: str) -> Tensor:
    """The whole sequence assembled without an all-gather: an all-reduce of a zero buffer that
    holds this rank's shard at its offset (the buffer is the all-reduce's own), or the pieces
    broadcast by each rank in turn, or passed around a ring, joined by a cat (the model's own)."""
    p, me = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)
    x = x.contiguous()
    if form == "allreduce_pad":
        shape = list(x.shape)
        shape[dim] *= p
        full = x.new_zeros(shape)
        full.narrow(dim, me * x.shape[dim], x.shape[dim]).copy_(x)
        dist.all_reduce(full, group=group)
        return TRUTH.collective_buffer(full)
    pieces: list[Tensor] = [x] * p
    if form == "broadcast":
        for src in range(p):
            if src != me:
                pieces[src] = torch.empty_like(x)
            dist.broadcast(pieces[src], src=ranks[src], group=group)
        return torch.cat(pieces, dim=dim)
    block = x  # ring: pass the blocks on, P - 1 times, each to the next rank, from the previous
    for step in range(1, p):
        incoming = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, block, ranks[(me + 1) % p], group),
               dist.P2POp(dist.irecv, incoming, ranks[(me - 1) % p], group)]  # fmt: skip
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        pieces[(me - step) % p] = block = incoming
    return torch.cat(pieces, dim=dim)


def offloading(how: str | None, plant: bool = False) -> Any:
    """Saved tensors offloaded as a user offloads them: ``save_on_cpu(pin_memory=True)``, or a
    pack hook that keeps a copy. ``plant``: the copy of the tensor the stray saves is the plant
    (the storage autograd keeps in its place)."""
    if how is None:
        return contextlib.nullcontext()
    if how == "save_on_cpu":
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
        inner = ctx.pack_hook
    else:
        ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t)
        inner = ctx.pack_hook

    def pack(t: Tensor) -> Any:
        packed = inner(t)
        if plant and TRUTH.offload_source is not None and _storage(t).data_ptr() == TRUTH.offload_source:
            TRUTH.planted(packed[1] if isinstance(packed, tuple) else packed)
        return packed

    ctx.pack_hook = pack
    return ctx


def scatter_seq(x: Tensor, group: dist.ProcessGroup, dim: int, form: str) -> Tensor:
    """Sum over the group and keep this rank's sequence shard along ``dim``."""
    p = dist.get_world_size(group)
    if form == "all_reduce_chunk":  # in place, then this rank's chunk (a view where it is contiguous)
        full = x.contiguous()
        dist.all_reduce(full, group=group)
        return full.chunk(p, dim=dim)[dist.get_rank(group)].contiguous()
    full = x.movedim(dim, 0).contiguous()
    if form == "funcol":
        out = funcol.reduce_scatter_tensor(full, "sum", 0, group)
        out = out.wait() if hasattr(out, "wait") else out
    else:
        out = torch.empty((full.shape[0] // p, *full.shape[1:]), dtype=x.dtype)
        dist.reduce_scatter_tensor(out, full, group=group)
    return out.movedim(0, dim)


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup, dim: int, form: str) -> Tensor:
        ctx.group, ctx.dim, ctx.form = group, dim, form
        return gather_seq(x, group, dim, form)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return scatter_seq(grad, ctx.group, ctx.dim, "reduce_scatter"), None, None, None


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup, dim: int, form: str) -> Tensor:
        ctx.group, ctx.dim = group, dim
        return scatter_seq(x, group, dim, form)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return gather_seq(grad, ctx.group, ctx.dim, "into_tensor"), None, None, None


class ColumnParallel(torch.autograd.Function):
    """Gather the shard, multiply by this rank's weight rows; save the shard, gather it again in
    backward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, group: dist.ProcessGroup, dim: int, form: str) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.dim = group, dim
        return F.linear(gather_seq(x, group, dim, form), weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        full = gather_seq(x, ctx.group, ctx.dim, "into_tensor")
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1]).to(grad.dtype)
        return scatter_seq(grad @ weight.to(grad.dtype), ctx.group, ctx.dim, "reduce_scatter"), grad_weight.to(
            weight.dtype), None, None, None  # fmt: skip


class Probe(nn.Module):
    """Gathers the sequence outside autograd (a user's debugging view of the whole activation)."""

    def __init__(self, group: dist.ProcessGroup, dim: int, form: str) -> None:
        super().__init__()
        self.group, self.dim, self.form = group, dim, form

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            return gather_seq(x, self.group, self.dim, self.form)


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
        self.probe = Probe(group, self.dim, d.gather)
        self.cache: Tensor | None = None
        self.stray: str | None = None  # the way this forward keeps a stray, when it does
        self.in_row = False  # block_sac runs a row-parallel linear (its SAC policy recomputes those)

    def attention(self, x: Tensor) -> Tensor:
        d = self.d
        qkv = ColumnParallel.apply(self.attn_norm(x), self.wqkv, self.group, self.dim, d.gather)
        if self.dim == 0:
            qkv = qkv.transpose(0, 1)  # [B, S, 3w]
        b, s, _ = qkv.shape
        q, k, v = qkv.reshape(b, s, 3, self.local_heads, d.head_dim).permute(2, 0, 3, 1, 4)  # [B, a/P, S, d]
        probs = (q @ k.transpose(-1, -2) / math.sqrt(d.head_dim)).softmax(-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        if self.dim == 0:
            ctx = ctx.transpose(0, 1)
        return Scatter.apply(F.linear(ctx, self.wo), self.group, self.dim, d.scatter)

    def mlp(self, x: Tensor, way: str | None) -> Tensor:
        d = self.d
        h = self.mlp_norm(x)
        if way == "autograd":  # a plain linear on the gathered input: autograd saves it whole
            full = Gather.apply(h, self.group, self.dim, d.gather).contiguous()
            if torch.is_autocast_enabled("cpu"):  # what the linear saves: its input in the autocast dtype
                full = full.to(torch.get_autocast_dtype("cpu"))
            TRUTH.planted(full)
            up = F.linear(full, self.fc1)
        elif way == "offload":  # the same, through a pack hook that keeps a copy in its place
            full = Gather.apply(h, self.group, self.dim, d.gather).contiguous()
            if torch.is_autocast_enabled("cpu"):
                full = full.to(torch.get_autocast_dtype("cpu"))
            TRUTH.offload_source = _storage(full).data_ptr()
            with offloading(d.offload, plant=True):
                up = F.linear(full, self.fc1)
            TRUTH.offload_source = None
        else:
            up = ColumnParallel.apply(h, self.fc1, self.group, self.dim, d.gather)
        if way in ("list", "attr", "hook"):
            full = self.probe(h)  # the hook way: a forward hook on probe keeps it (see Model)
            TRUTH.planted(full)
            if way == "list":
                STASH.append(full)
            elif way == "attr":
                self.cache = full
        if way == "compile":  # the compiled block moved inside the gathered region
            full = Gather.apply(h, self.group, self.dim, d.gather).contiguous()
            TRUTH.planted(full)
            up = up + F.linear(compiled_block(full, self.scale), self.fc1)
        return Scatter.apply(F.linear(F.gelu(up), self.fc2), self.group, self.dim, d.scatter)

    def block(self, way: str | None, x: Tensor) -> Tensor:
        if self.d.offload and way != "offload":  # a clean draw offloads every save of its layers
            with offloading(self.d.offload):
                return self._block(way, x)
        return self._block(way, x)

    def _block(self, way: str | None, x: Tensor) -> Tensor:
        x = x + self.attention(x)
        if self.d.compiled and way != "compile":
            x = compiled_block(x, self.scale)  # on the shard: sharded saves
        return x + self.mlp(x, way)

    def forward(self, x: Tensor) -> Tensor:
        # the way is this forward's: a recomputation in backward does what its forward did, even
        # where the next micro-batch's forward (grouped order) set another
        way = self.stray
        if self.d.checkpoint == "full":
            return checkpoint(partial(self.block, way), x, use_reentrant=False)
        if self.d.checkpoint == "sac":
            return checkpoint(partial(self.block_sac, way), x, use_reentrant=False, context_fn=partial(
                create_selective_checkpoint_contexts, partial(self.policy, way)))  # fmt: skip
        return self.block(way, x)

    def block_sac(self, way: str | None, x: Tensor) -> Tensor:
        """The block with its gathers as functional collectives, which a SAC policy can see."""
        h = self.attn_norm(x)
        full = funcol.all_gather_tensor_autograd(h.movedim(self.dim, 0).contiguous(), 0, self.group)
        qkv = F.linear(TRUTH.collective_buffer(full).movedim(0, self.dim), self.wqkv)
        if self.dim == 0:
            qkv = qkv.transpose(0, 1)
        b, s, _ = qkv.shape
        q, k, v = qkv.reshape(b, s, 3, self.local_heads, self.d.head_dim).permute(2, 0, 3, 1, 4)
        ctx = ((q @ k.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
        if self.dim == 0:
            ctx = ctx.transpose(0, 1)
        self.in_row = True
        part = F.linear(ctx, self.wo).movedim(self.dim, 0).contiguous()
        self.in_row = False
        x = x + funcol.reduce_scatter_tensor_autograd(part, "sum", 0, self.group).movedim(0, self.dim)
        h = self.mlp_norm(x)
        full = funcol.all_gather_tensor_autograd(h.movedim(self.dim, 0).contiguous(), 0, self.group)
        if way == "sac":
            TRUTH.planted(full)
        up = F.gelu(F.linear(TRUTH.collective_buffer(full).movedim(0, self.dim), self.fc1))
        self.in_row = True
        part = F.linear(up, self.fc2)
        self.in_row = False
        part = part.movedim(self.dim, 0).contiguous()
        return x + funcol.reduce_scatter_tensor_autograd(part, "sum", 0, self.group).movedim(0, self.dim)

    def policy(self, way: str | None, ctx, op, *args, **kwargs):
        """Keep the column-parallel and attention matmul outputs (sharded: [.., S, w/P]);
        recompute everything else, the gathers included. The stray: MUST_SAVE the all-gather's
        output as well."""
        name = str(op)
        # a row-parallel product (wo, fc2) is a full-size partial sum until its reduce-scatter (told
        # by where it runs: under autocast its weight is a cast copy, no view of the parameter)
        row = name.startswith("aten.mm") and self.in_row
        keep = ("mm" in name and not row) or (way == "sac" and ("all_gather" in name or "wait_tensor" in name))
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


class Model(nn.Module):
    def __init__(self, d: Draw, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.d = d
        self.layers = nn.ModuleList(Layer(d, group) for _ in range(d.layers))
        # a learned positional table of the whole sequence, [S, H] (full-size at B = 1): each rank
        # multiplies by its own rows, and autograd saves that view of the parameter
        self.pos = nn.Parameter(torch.randn(d.seq, d.hidden) * 0.02) if d.pos_param else None
        self.kept: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers):
            layer.probe.register_forward_hook(partial(self._keep, i))

    def _keep(self, i: int, module: nn.Module, args: Any, output: Tensor) -> None:
        if self.layers[i].stray == "hook":
            self.kept[f"layers.{i}"] = output

    def forward(self, x: Tensor) -> Tensor:
        if self.pos is not None:
            s = x.shape[1 if self.d.layout == "bsh" else 0]
            r = dist.get_rank(self.layers[0].group)
            rows = self.pos[r * s : (r + 1) * s]  # [S/P, H], a view of the full-size parameter
            x = x * (rows.unsqueeze(1) if self.d.layout == "sbh" else rows)  # autograd saves the view
        for layer in self.layers:
            x = layer(x)
        return x


def run_draw(d: Draw, groups: dict[int, dist.ProcessGroup], root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    group = groups[d.sp]
    dtype = getattr(torch, d.dtype)
    torch.manual_seed(1000 + int(d.name[1:]))
    model = Model(d, group).to(dtype)
    if d.instrumented:
        import sptrace

        sptrace.instrument(model)
    local = (d.batch, d.seq // d.sp, d.hidden) if d.layout == "bsh" else (d.seq // d.sp, d.batch, d.hidden)
    # (an input that needs its gradient, as an embedding's output does, where the positional
    # table multiplies it: then autograd saves the table's rows)
    xs = [torch.randn(local, dtype=dtype).requires_grad_(d.pos_param) for _ in range(d.micro_batches)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    stray = d.stray or {}
    record: dict[str, Any] = {"plant": None, "profiler_step": None, "alive_buffers": []}

    def set_stray(step: int | None, mb: int) -> None:
        for i, layer in enumerate(model.layers):
            hit = stray and step == stray["step"] and mb == stray["micro_batch"] and i == stray["layer"]
            layer.stray = stray["way"] if hit else None

    def boundary(step: int | None, mb: int, step_num: int | None) -> None:
        """What torch saw at this micro-batch's forward -> backward boundary."""
        if step is None:
            return
        record["alive_buffers"] += [{"step": step_num, "micro_batch": mb, "ptr": p} for p in TRUTH.alive()]
        if stray and step == stray["step"] and mb == stray["micro_batch"]:
            info = dict(TRUTH.plant_info or {})
            info["alive_at_boundary"] = TRUTH.plant is not None and TRUTH.plant() is not None
            record["plant"], record["profiler_step"] = info, step_num

    def forward(step: int | None, mb: int, x: Tensor) -> Tensor:
        set_stray(step, mb)
        TRUTH.micro_batch = mb
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if d.autocast else contextlib.nullcontext()
        with cast:
            return model(x).float().square().mean() / len(xs)

    def backward(loss: Tensor) -> None:
        TRUTH.in_backward = True
        loss.backward()
        TRUTH.in_backward = False

    def train_step(step: int | None, step_num: int | None = None) -> None:
        """One training step (``step``: the profiled step's index, None when unprofiled;
        ``step_num``: the ProfilerStep number the trace gives it)."""
        TRUTH.recording = step is not None
        TRUTH.buffers.clear()
        losses = []
        for mb, x in enumerate(xs):
            loss = forward(step, mb, x)
            if d.order == "interleaved":
                boundary(step, mb, step_num)
                backward(loss)
            else:
                losses.append(loss)
        for mb, loss in enumerate(losses):  # grouped: f0 f1 ... then b0 b1 ...
            TRUTH.micro_batch = mb
            boundary(step, mb, step_num)
            backward(loss)
        set_stray(None, -1)
        TRUTH.recording = False
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_step(None)  # warm-up (and the compile, for compiled draws)
    dist.barrier()
    out = root / d.name
    out.mkdir(parents=True, exist_ok=True)
    if d.instrumented:  # the README's recipe: sptrace.instrument, then sptrace.profile_step
        import sptrace

        warmup = 1
        sptrace.profile_step(lambda k: train_step(k - warmup if k >= warmup else None, k), out, warmup=warmup,
                             steps=d.steps, run_info={"batch": d.batch, "seq": d.seq, "hidden": d.hidden,
                                                      "sp_size": d.sp})  # fmt: skip
    else:  # a bare profiler with a schedule, prof.step() after each step
        with profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
            schedule=schedule(wait=0, warmup=1, active=d.steps, repeat=1),
        ) as prof:  # fmt: skip
            train_step(None)  # the profiler's warm-up step
            prof.step()
            for step in range(d.steps):
                train_step(step, prof.step_num)
                prof.step()
            # the list, the attribute and the hook keep their tensor past the profiled window
        prof.export_chrome_trace(str(out / f"rank{rank}.json"))
    STASH.clear()
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, record)
    if rank == 0:
        truth = {"draw": d.to_dict(), "world": world, "ranks": per_rank,
                 "stray": {**stray, "profiler_step": per_rank[0]["profiler_step"]} if stray else None}  # fmt: skip
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
    # every rank takes part in creating every group; P = 2 and 4 are groups of consecutive ranks
    groups = {world: dist.group.WORLD}
    for p in (2, 4):
        mine = [dist.new_group(list(range(start, start + p))) for start in range(0, world, p)]
        groups[p] = mine[rank // p]
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
