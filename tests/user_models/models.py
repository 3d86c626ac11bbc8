"""Small sequence-parallel models written the way third parties write them: PyTorch-native
tensor parallelism, raw functional collectives, torch.distributed's list collectives, P2P rings,
selective activation checkpointing. None of them imports sptrace or writes its markers.

Every model takes and returns this rank's [B, S/P, H] sequence shard (torchtitan's layout)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn


class Mlp(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=False)
        self.fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


# ---- 1. PyTorch-native TP + SP (torchtitan's plan) -----------------------------------------------


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.wq = nn.Linear(hidden, hidden, bias=False)
        self.wk = nn.Linear(hidden, hidden, bias=False)
        self.wv = nn.Linear(hidden, hidden, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)  # [B, S, H/P] each after ColwiseParallel
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # [B, a/P, S, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(hidden)
        self.attention = Attention(hidden, heads)
        self.ffn_norm = nn.LayerNorm(hidden)
        self.feed_forward = Mlp(hidden, ffn)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def parallelize_tp_sp(model: Transformer, mesh) -> Transformer:
    """torchtitan's Llama plan: norms sequence-parallel, projections column/row-parallel."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    for block in model.layers:
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.fc1": ColwiseParallel(),
            "feed_forward.fc2": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(block, mesh, plan)
    return model


# ---- 2. Ulysses attention with raw functional collectives ------------------------------------------


class FunctionalUlysses(nn.Module):
    """DeepSpeed-Ulysses written with torch.distributed._functional_collectives: an all-to-all
    from sequence to heads for q, k and v, local attention, and back."""

    def __init__(self, hidden: int, heads: int, ffn: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group, self.heads, self.head_dim = group, heads, hidden // heads
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = Mlp(hidden, ffn)

    def _seq_to_heads(self, t: Tensor) -> Tensor:
        b, s_local, h, d = t.shape  # [B, S/P, a, d]
        p = dist.get_world_size(self.group)
        x = t.reshape(b, s_local, p, h // p, d).permute(2, 1, 0, 3, 4).contiguous()  # [P, S/P, B, a/P, d]
        x = funcol.all_to_all_single_autograd(x, None, None, self.group)
        return x.reshape(p * s_local, b, h // p, d).permute(1, 2, 0, 3)  # [B, a/P, S, d]

    def _heads_to_seq(self, t: Tensor) -> Tensor:
        b, h_local, s, d = t.shape
        p = dist.get_world_size(self.group)
        x = t.reshape(b, h_local, p, s // p, d).permute(2, 3, 0, 1, 4).contiguous()  # [P, S/P, B, a/P, d]
        x = funcol.all_to_all_single_autograd(x, None, None, self.group)
        return x.permute(2, 1, 0, 3, 4).reshape(b, s // p, h_local * p * d)  # [B, S/P, H]

    def forward(self, x: Tensor) -> Tensor:
        b, s_local, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s_local, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (self._seq_to_heads(t) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.proj(self._heads_to_seq(out))
        return h + self.mlp(h)


# ---- 3. a stack gathered with torch.distributed.nn's list all_gather --------------------------------


class ListGatherBlock(nn.Module):
    """Gathers the sequence with ``torch.distributed.nn.functional.all_gather`` (a list of
    tensors, autograd-aware: its backward scatters on gloo), mixes tokens, keeps its own shard."""

    def __init__(self, hidden: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group
        self.norm = nn.LayerNorm(hidden)
        self.mix = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        from torch.distributed.nn.functional import all_gather

        pieces = all_gather(self.norm(x).contiguous(), group=self.group)
        full = torch.cat(pieces, dim=1)  # [B, S, H]
        context = full.mean(dim=1, keepdim=True)  # a global token summary, [B, 1, H]
        return x + self.mix(x * context)


# ---- 4. Megatron-style SP with explicit c10d collectives ---------------------------------------------


class _GatherSeq(torch.autograd.Function):
    """All-gather the sequence in forward (dim 1), reduce-scatter the gradient in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        p = dist.get_world_size(group)
        shard = x.transpose(0, 1).contiguous()  # [S/P, B, H]
        out = torch.empty((p * shard.shape[0], *shard.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(out, shard, group=group)
        return out.transpose(0, 1)  # [B, S, H]

    @staticmethod
    def backward(ctx, grad: Tensor):
        p = dist.get_world_size(ctx.group)
        full = grad.transpose(0, 1).contiguous()
        out = torch.empty((full.shape[0] // p, *full.shape[1:]), dtype=grad.dtype)
        dist.reduce_scatter_tensor(out, full, group=ctx.group)
        return out.transpose(0, 1), None


class _ScatterSeq(torch.autograd.Function):
    """Reduce-scatter the sequence in forward, all-gather the gradient in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        p = dist.get_world_size(group)
        full = x.transpose(0, 1).contiguous()
        out = torch.empty((full.shape[0] // p, *full.shape[1:]), dtype=x.dtype)
        dist.reduce_scatter_tensor(out, full, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        p = dist.get_world_size(ctx.group)
        shard = grad.transpose(0, 1).contiguous()
        out = torch.empty((p * shard.shape[0], *shard.shape[1:]), dtype=grad.dtype)
        dist.all_gather_into_tensor(out, shard, group=ctx.group)
        return out.transpose(0, 1), None


class _ColumnParallel(torch.autograd.Function):
    """Megatron's column-parallel linear with sequence parallelism: saves the SHARD and
    re-gathers it in backward for the weight gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.group = group
        with torch.no_grad():
            full = _GatherSeq.forward(ctx, x, group)
        return full @ weight.t()

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        with torch.no_grad():
            full = _GatherSeq.forward(ctx, x, ctx.group)  # the re-gather
        grad_weight = grad.flatten(0, 1).t() @ full.flatten(0, 1)
        grad_full = grad @ weight
        grad_x, _ = _GatherSeq.backward(ctx, grad_full)
        return grad_x, grad_weight, None


class Stall(nn.Module):
    """A host-side stall inside a layer (a slow data path, a Python hiccup, a throttled device as
    the host sees it): the layer sleeps ``seconds`` before its work. ``slept`` times each call."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.slept: list[float] = []

    def forward(self, x: Tensor) -> Tensor:
        began = time.perf_counter()
        time.sleep(self.seconds)
        self.slept.append(time.perf_counter() - began)
        return x


class MegatronMlp(nn.Module):
    def __init__(self, hidden: int, ffn: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        p = dist.get_world_size(group)
        self.group = group
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Parameter(torch.randn(ffn // p, hidden) / hidden**0.5)  # column-parallel
        self.fc2 = nn.Parameter(torch.randn(hidden, ffn // p) / ffn**0.5)  # row-parallel
        self.debug_store: list[Tensor] | None = None
        self.aux_steps = 0
        """Matmuls of an auxiliary statistic computed before the up-projection (0: none): on one
        rank, a load imbalance inside the layer. ``aux_seconds`` times each call's."""
        self.aux_seconds: list[float] = []
        self.keep_gathered = False
        """fc1 as PyTorch-native ColwiseParallel after SequenceParallel has it: the gathered
        [B, S, H] input goes into a plain matmul, which saves it for backward."""
        self.stall: Stall | None = None
        """A Stall run before the layer's work (None: none)."""

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H]
        if self.stall is not None:
            x = self.stall(x)
        h = self.norm(x)
        if self.aux_steps:
            began = time.perf_counter()
            with torch.no_grad():  # real compute, whose result is discarded
                m = torch.randn(192, 192)
                acc = m
                for _ in range(self.aux_steps):
                    acc = torch.tanh(acc @ m)
            self.aux_seconds.append(time.perf_counter() - began)
        if self.debug_store is not None:  # "log the full activation later": a Python list holds it
            self.debug_store.append(_GatherSeq.apply(h, self.group).detach())
        if self.keep_gathered:
            up = F.gelu(_GatherSeq.apply(h, self.group) @ self.fc1.t())
        else:
            up = F.gelu(_ColumnParallel.apply(h, self.fc1, self.group))  # [B, S, F/P]
        return x + _ScatterSeq.apply(up @ self.fc2.t(), self.group)


class MegatronStack(nn.Module):
    def __init__(self, layers: int, hidden: int, ffn: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MegatronMlp(hidden, ffn, group) for _ in range(layers))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


# ---- 5. a ring of point-to-point transfers (ring attention's K/V pass) -------------------------------


def ring_pass(block: Tensor, group: dist.ProcessGroup, steps: int) -> list[Tensor]:
    """Hand this rank's block around the ring ``steps`` times with batch_isend_irecv; returns
    every block seen (ring attention's key/value rotation)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    send_to = dist.get_global_rank(group, (rank + 1) % world)
    recv_from = dist.get_global_rank(group, (rank - 1) % world)
    seen = [block]
    for _ in range(steps):
        incoming = torch.empty_like(block)
        ops = [dist.P2POp(dist.isend, seen[-1], send_to, group), dist.P2POp(dist.irecv, incoming, recv_from, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        seen.append(incoming)
    return seen


class RingMixer(nn.Module):
    """Attention over the whole sequence computed block by block as K/V rotate around the ring."""

    def __init__(self, hidden: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group
        self.kv = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        kv = self.kv(x)  # [B, S/P, H]
        with torch.no_grad():  # the rotation itself is not differentiated (a forward-only pass)
            blocks = ring_pass(kv.detach().contiguous(), self.group, dist.get_world_size(self.group) - 1)
        scores = torch.stack([(x * b).sum(-1) for b in blocks], dim=-1).softmax(-1)  # [B, S/P, P]
        return x + kv * scores.mean(-1, keepdim=True)


# ---- 6. selective activation checkpointing that keeps a gathered tensor --------------------------------


class CheckpointedGather(nn.Module):
    """A block under non-reentrant selective activation checkpointing whose policy saves matmul
    outputs and the all-gathered sequence: the gathered [B, S, H] tensor lives in the SAC cache,
    not in autograd's saved tensors. With keep_gathered=False the policy saves only the matmul
    outputs (sequence shards) and recomputes the gather in backward: the clean way to use SAC."""

    def __init__(self, hidden: int, group: dist.ProcessGroup, keep_gathered: bool = True) -> None:
        super().__init__()
        self.group = group
        self.keep_gathered = keep_gathered
        self.norm = nn.LayerNorm(hidden)
        self.mix = nn.Linear(hidden, hidden, bias=False)
        self.recorded: list[tuple[str, tuple[int, ...]]] = []

    def policy(self, ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy

        name = str(op)
        keep = "mm" in name or (self.keep_gathered and ("all_gather" in name or "wait_tensor" in name))
        if keep and not ctx.is_recompute and isinstance(ctx.op_output, Tensor):
            self.recorded.append((name, tuple(ctx.op_output.shape)))
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def _inner(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        gathered = funcol.all_gather_tensor_autograd(h.transpose(0, 1).contiguous(), 0, self.group)  # [S, B, H]
        full = gathered.transpose(0, 1)  # [B, S, H]
        context = full.mean(dim=1, keepdim=True)
        return x + self.mix(x * context)

    def forward(self, x: Tensor) -> Tensor:
        from functools import partial

        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        return checkpoint(
            self._inner, x, use_reentrant=False, context_fn=partial(create_selective_checkpoint_contexts, self.policy)
        )


# ---- 6b. DeepSpeed-Ulysses' DistributedAttention, sequence-first ----------------------------------


def _seq_first_all_to_all(x: Tensor, scatter_heads: bool, group: dist.ProcessGroup) -> Tensor:
    """DeepSpeed's sequence-first all-to-all, as deepspeed/sequence/layer.py lays it out (written
    anew here). Heads out, sequence in: [S/P, B, a, d] -> [P, S/P, B, a/P, d] (the all-to-all's
    buffer) -> [S, B, a/P, d], a view of it. Sequence out, heads in: [S, B, a/P, d] ->
    [P, S/P, B, a/P, d] -> [S/P, B, P, a/P, d] -> [S/P, B, a, d]."""
    p = dist.get_world_size(group)
    if scatter_heads:
        s_local, b, a, d = x.shape
        send = x.reshape(s_local, b, p, a // p, d).permute(2, 0, 1, 3, 4).contiguous()
    else:
        s, b, a_local, d = x.shape
        send = x.reshape(p, s // p, b, a_local, d).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)
    if scatter_heads:
        return got.reshape(s_local * p, b, a // p, d)
    return got.permute(1, 2, 0, 3, 4).reshape(s // p, b, a_local * p, d)


class _SeqAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scatter_heads: bool, group: dist.ProcessGroup) -> Tensor:
        ctx.scatter_heads, ctx.group = scatter_heads, group
        return _seq_first_all_to_all(x, scatter_heads, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _seq_first_all_to_all(grad.contiguous(), not ctx.scatter_heads, ctx.group), None, None


class DeepSpeedUlysses(nn.Module):
    """A sequence-first block ([S/P, B, H] in and out) around DeepSpeed-Ulysses'
    DistributedAttention: q, k, v are [S/P, B, a, d] until the all-to-all gives each rank the
    whole sequence for a/P heads; the context goes back the other way. Weights are whole on
    every rank (Ulysses has no tensor parallelism)."""

    def __init__(self, hidden: int, heads: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.heads, self.group = heads, group
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: Tensor) -> Tensor:
        s_local, b, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(s_local, b, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (_SeqAllToAll.apply(t.contiguous(), True, self.group) for t in (q, k, v))  # [S, B, a/P, d]
        context = nn.functional.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)))
        context = _SeqAllToAll.apply(context.permute(2, 0, 1, 3).contiguous(), False, self.group)  # [S/P, B, a, d]
        x = x + self.proj(context.reshape(s_local, b, h))
        return x + self.mlp(x)


# ---- 7. ring attention over a subgroup, written with dist.isend / dist.irecv -------------------------


class _UserRingAttention(torch.autograd.Function):
    """Non-causal ring attention as a user writes it from the papers: K and V (concatenated)
    go to the next rank of the ring at each step while the block in hand is attended; in backward
    K,V go around again and each block's dK,dV accumulator travels with it, one more hop at the
    end bringing it home (P-1 K,V and P dK,dV transfers). Plain isend/irecv, no batching."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup) -> Tensor:
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        nxt, prv = dist.get_global_rank(group, (rank + 1) % size), dist.get_global_rank(group, (rank - 1) % size)
        scale = q.shape[-1] ** -0.5
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"))
        kv = torch.cat([k, v], dim=-1).contiguous()
        for step in range(size):
            works = []
            if step < size - 1:
                incoming = torch.empty_like(kv)
                works = [dist.isend(kv, nxt, group=group, tag=0), dist.irecv(incoming, prv, group=group, tag=0)]
            kb, vb = kv.split(k.shape[-1], dim=-1)
            s = q @ kb.transpose(-1, -2) * scale
            block_lse = s.logsumexp(-1)
            new = torch.logaddexp(lse, block_lse)
            out = (
                out * (lse - new).exp()[..., None]
                + (s - block_lse[..., None]).exp() @ vb * (block_lse - new).exp()[..., None]
            )
            lse = new
            for work in works:
                work.wait()
            if works:
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        nxt, prv = dist.get_global_rank(group, (rank + 1) % size), dist.get_global_rank(group, (rank - 1) % size)
        scale = q.shape[-1] ** -0.5
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        kv = torch.cat([k, v], dim=-1).contiguous()
        dkv = torch.zeros_like(kv)
        for step in range(size):
            works = []
            if step < size - 1:
                incoming = torch.empty_like(kv)
                works = [dist.isend(kv, nxt, group=group, tag=0), dist.irecv(incoming, prv, group=group, tag=0)]
            kb, vb = kv.split(k.shape[-1], dim=-1)
            p = (q @ kb.transpose(-1, -2) * scale - lse[..., None]).exp()
            ds = p * (dout @ vb.transpose(-1, -2) - delta[..., None])
            dq += ds @ kb * scale
            dkv = dkv + torch.cat([ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ dout], dim=-1)
            arriving = torch.empty_like(dkv)
            passing = [dist.isend(dkv, nxt, group=group, tag=1), dist.irecv(arriving, prv, group=group, tag=1)]
            for work in works + passing:
                work.wait()
            dkv = arriving
            if works:
                kv = incoming
        dk, dv = dkv.split(k.shape[-1], dim=-1)
        return dq, dk, dv, None


class UserRingAttention(nn.Module):
    """qkv projection, ring attention over ``group`` on this rank's tokens, output projection."""

    def __init__(self, hidden: int, heads: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.heads, self.group = heads, group
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H]
        B, s, H = x.shape
        q, k, v = self.qkv(x).view(B, s, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)  # [B, h, s, d]
        ctx = _UserRingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), self.group)
        return x + self.proj(ctx.transpose(1, 2).reshape(B, s, H))
