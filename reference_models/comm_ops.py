"""The collectives of sequence parallelism, each an autograd Function pairing a forward
collective with its backward twin (Megatron-Core ``tensor_parallel/mappings.py`` and DeepSpeed
``sequence/layer.py`` describe the same pairs).

Activations are batch-first, [B, S/P, ...] per rank. Buffers are allocated on the input's
device, so gloo on CPU and NCCL on GPU run the same code. Every function returns its input
unchanged when the group has one rank: a P=1 run issues no collective.

``tag`` names the module a collective works for; while a profiler runs it is written into
the trace as ``sptrace.comm::<module>::<role>`` so that backward collectives keep their layer.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import Tensor

from sptrace.instrumentation import annotate as _annotate
from sptrace.vocab import markers

Group = dist.ProcessGroup


def annotate(name: str) -> contextlib.AbstractContextManager[object]:
    """The collective's sptrace.comm marker; none when the module has no tag (markers off)."""
    if name.startswith(markers.COMM + "::"):
        return contextlib.nullcontext()
    return _annotate(name)


def _size(group: Group) -> int:
    return dist.get_world_size(group)


def _rank(group: Group) -> int:
    return dist.get_rank(group)


# ---- Megatron-Core's global memory buffer -------------------------------------------------


_BUFFERS: dict[tuple[str, torch.dtype, torch.device], Tensor] = {}


def global_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, name: str) -> Tensor:
    """A view of one persistent tensor per (name, dtype, device), grown when a larger one is
    asked for (Megatron-Core's ``get_global_memory_buffer().get_tensor``): the gathered input of
    a column-parallel linear and a reduce-scatter's input are filled, consumed by the next op and
    never kept, so one buffer serves every layer. Made once, in the first (warm-up) step: no
    step allocates them again, and no backend thread ever frees them."""
    n = 1
    for d in shape:
        n *= d
    key = (name, dtype, device)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _BUFFERS[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(shape)


# ---- plain collectives (no autograd), the building blocks --------------------------------


def all_gather_seq(
    x: Tensor, group: Group, tag: str = "", role: str = "all_gather", buffer: str | None = None
) -> Tensor:
    """[B, S/P, ...] -> [B, S, ...]: all-gather along the sequence (dim 1). ``buffer``: gather
    into that global buffer (a temporary the caller consumes at once), else a new tensor."""
    P = _size(group)
    if P == 1:
        return x
    with annotate(markers.comm_name(tag, f"{role}|group={P}")):
        shard = x.transpose(0, 1).contiguous()  # [S/P, B, ...]: ranks' shards are contiguous
        shape = (P * shard.shape[0], *shard.shape[1:])
        out = (
            global_buffer(shape, x.dtype, x.device, buffer)
            if buffer
            else torch.empty(shape, dtype=x.dtype, device=x.device)
        )
        dist.all_gather_into_tensor(out, shard, group=group)  # [S, B, ...]
    return out.transpose(0, 1)  # [B, S, ...], a view


def reduce_scatter_seq(x: Tensor, group: Group, tag: str = "", role: str = "reduce_scatter") -> Tensor:
    """[B, S, ...] partial sums -> [B, S/P, ...] summed: reduce-scatter along the sequence."""
    P = _size(group)
    if P == 1:
        return x
    with annotate(markers.comm_name(tag, f"{role}|group={P}")):
        full = global_buffer((x.shape[1], x.shape[0], *x.shape[2:]), x.dtype, x.device, "reduce_scatter_input")
        full.copy_(x.transpose(0, 1))  # [S, B, ...], consumed by the reduce-scatter alone
        out = torch.empty((full.shape[0] // P, *full.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, full, group=group)  # [S/P, B, ...]
    return out.transpose(0, 1).contiguous()


def all_gather_last(x: Tensor, group: Group, tag: str = "", role: str = "all_gather_last") -> Tensor:
    """[..., K/P] -> [..., K]: all-gather along the last dim (Megatron, GQA with g < P)."""
    P = _size(group)
    if P == 1:
        return x
    with annotate(markers.comm_name(tag, f"{role}|group={P}")):
        shard = x.movedim(-1, 0).contiguous()
        out = torch.empty((P * shard.shape[0], *shard.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, shard, group=group)
    return out.movedim(0, -1)


def reduce_scatter_last(x: Tensor, group: Group, tag: str = "", role: str = "reduce_scatter_last") -> Tensor:
    """[..., K] partial sums -> [..., K/P] summed along the last dim."""
    P = _size(group)
    if P == 1:
        return x
    with annotate(markers.comm_name(tag, f"{role}|group={P}")):
        full = x.movedim(-1, 0).contiguous()
        out = torch.empty((full.shape[0] // P, *full.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, full, group=group)
    return out.movedim(0, -1).contiguous()


def all_reduce_(x: Tensor, group: Group, tag: str = "", role: str = "all_reduce") -> Tensor:
    if _size(group) > 1:
        # c10d::allreduce_ takes a TensorList, whose dtype the trace does not record
        dtype = str(x.dtype).removeprefix("torch.")
        with annotate(markers.comm_name(tag, f"{role}|dtype={dtype}|group={_size(group)}")):
            dist.all_reduce(x, group=group)
    return x


def all_to_all_4d(x: Tensor, group: Group, scatter_dim: int, gather_dim: int, tag: str, role: str) -> Tensor:
    """Ulysses' layout switch on [B, S, heads, d]: split ``scatter_dim`` into P pieces, send
    piece j to rank j, concatenate what arrives along ``gather_dim``.

    seq -> heads: scatter_dim=2, gather_dim=1: [B, S/P, h, d] -> [B, S, h/P, d]
    heads -> seq: scatter_dim=1, gather_dim=2: [B, S, h/P, d] -> [B, S/P, h, d]
    """
    P = _size(group)
    if P == 1:
        return x
    with annotate(markers.comm_name(tag, f"{role}|group={P}")):
        shape = list(x.shape)
        chunk = shape[scatter_dim] // P
        # put the P destination pieces first: [P, ...] contiguous, piece j goes to rank j
        pieces = x.unflatten(scatter_dim, (P, chunk)).movedim(scatter_dim, 0).contiguous()
        out = torch.empty_like(pieces)
        dist.all_to_all_single(out, pieces, group=group)  # out[j] came from rank j
        # rank j's piece holds source positions j of gather_dim: put the source axis before it
        received = out.movedim(0, gather_dim)  # [..., P, n_gather, ...] at gather_dim
        new_shape = shape.copy()
        new_shape[scatter_dim] = chunk
        new_shape[gather_dim] = shape[gather_dim] * P
        return received.reshape(new_shape)


# ---- autograd pairs ------------------------------------------------------------------------


class _GatherSeq(torch.autograd.Function):
    """All-gather the sequence in forward; in backward reduce-scatter (``reduce_grad``: the
    consumers computed partial gradients, e.g. a column-parallel linear) or just keep this
    rank's slice (the consumers are replicated)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str, reduce_grad: bool) -> Tensor:
        ctx.group, ctx.tag, ctx.reduce_grad = group, tag, reduce_grad
        return all_gather_seq(x, group, tag, "ag_fwd")

    @staticmethod
    def backward(ctx, grad: Tensor):
        if ctx.reduce_grad:
            return reduce_scatter_seq(grad, ctx.group, ctx.tag, "rs_bwd"), None, None, None
        return _split_seq(grad, ctx.group), None, None, None


class _ReduceScatterSeq(torch.autograd.Function):
    """Reduce-scatter partial sums to sequence shards; backward all-gathers the gradient
    (SPEC.md §1 rows 2/4 forward, 5/8 backward)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        return reduce_scatter_seq(x, group, tag, "rs_fwd")

    @staticmethod
    def backward(ctx, grad: Tensor):
        return all_gather_seq(grad, ctx.group, ctx.tag, "ag_bwd").contiguous(), None, None


class _ScatterSeq(torch.autograd.Function):
    """Keep this rank's sequence slice of a replicated tensor; backward all-gathers."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        return _split_seq(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return all_gather_seq(grad, ctx.group, ctx.tag, "ag_bwd").contiguous(), None, None


class _CopyToTensorRegion(torch.autograd.Function):
    """Identity forward, all-reduce backward (Megatron's f without sequence parallelism)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        return x

    @staticmethod
    def backward(ctx, grad: Tensor):
        return all_reduce_(grad.contiguous(), ctx.group, ctx.tag, "ar_bwd"), None, None


class _ReduceFromTensorRegion(torch.autograd.Function):
    """All-reduce forward, identity backward (Megatron's g without sequence parallelism)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        return all_reduce_(x.contiguous(), group, tag, "ar_fwd")

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None


class _GatherLast(torch.autograd.Function):
    """All-gather the last dim forward, reduce-scatter it backward (Megatron's
    ``all_gather_last_dim_from_tensor_parallel_region``, used for GQA with g < P)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        return all_gather_last(x, group, tag, "ag_last_fwd")

    @staticmethod
    def backward(ctx, grad: Tensor):
        return reduce_scatter_last(grad, ctx.group, ctx.tag, "rs_last_bwd"), None, None


class _SeqToHeads(torch.autograd.Function):
    """Ulysses: [B, S/P, h, d] -> [B, S, h/P, d]; backward is the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        return all_to_all_4d(x, group, scatter_dim=2, gather_dim=1, tag=tag, role="a2a_fwd")

    @staticmethod
    def backward(ctx, grad: Tensor):
        return all_to_all_4d(grad, ctx.group, scatter_dim=1, gather_dim=2, tag=ctx.tag, role="a2a_bwd"), None, None


class _HeadsToSeq(torch.autograd.Function):
    """Ulysses: [B, S, h/P, d] -> [B, S/P, h, d]; backward is the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x: Tensor, group: Group, tag: str) -> Tensor:
        ctx.group, ctx.tag = group, tag
        return all_to_all_4d(x, group, scatter_dim=1, gather_dim=2, tag=tag, role="a2a_fwd")

    @staticmethod
    def backward(ctx, grad: Tensor):
        return all_to_all_4d(grad, ctx.group, scatter_dim=2, gather_dim=1, tag=ctx.tag, role="a2a_bwd"), None, None


def _split_seq(x: Tensor, group: Group) -> Tensor:
    P = _size(group)
    if P == 1:
        return x
    n = x.shape[1] // P
    return x.narrow(1, _rank(group) * n, n).contiguous()


def gather_from_sequence_parallel_region(x: Tensor, group: Group, tag: str = "", reduce_grad: bool = True) -> Tensor:
    """[B, S/P, H] -> [B, S, H]; backward reduce-scatters (or splits when ``reduce_grad`` is
    False, for a replicated consumer)."""
    if _size(group) == 1:
        return x
    return _GatherSeq.apply(x, group, tag, reduce_grad)


def reduce_scatter_to_sequence_parallel_region(x: Tensor, group: Group, tag: str = "") -> Tensor:
    """[B, S, H] partial -> [B, S/P, H]; backward all-gathers."""
    if _size(group) == 1:
        return x
    return _ReduceScatterSeq.apply(x, group, tag)


def scatter_to_sequence_parallel_region(x: Tensor, group: Group, tag: str = "") -> Tensor:
    """[B, S, H] replicated -> this rank's [B, S/P, H]; backward all-gathers."""
    if _size(group) == 1:
        return x
    return _ScatterSeq.apply(x, group, tag)


def copy_to_tensor_parallel_region(x: Tensor, group: Group, tag: str = "") -> Tensor:
    if _size(group) == 1:
        return x
    return _CopyToTensorRegion.apply(x, group, tag)


def reduce_from_tensor_parallel_region(x: Tensor, group: Group, tag: str = "") -> Tensor:
    if _size(group) == 1:
        return x
    return _ReduceFromTensorRegion.apply(x, group, tag)


def gather_last_dim_from_tensor_parallel_region(x: Tensor, group: Group, tag: str = "") -> Tensor:
    if _size(group) == 1:
        return x
    return _GatherLast.apply(x, group, tag)


def all_to_all_seq_to_heads(x: Tensor, group: Group, tag: str = "") -> Tensor:
    if _size(group) == 1:
        return x
    return _SeqToHeads.apply(x, group, tag)


def all_to_all_heads_to_seq(x: Tensor, group: Group, tag: str = "") -> Tensor:
    if _size(group) == 1:
        return x
    return _HeadsToSeq.apply(x, group, tag)
