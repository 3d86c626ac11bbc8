"""Ring attention (context parallelism over P2P), as TransformerEngine's
``AttnFuncWithCPAndKVP2P`` runs it for Megatron-Core's ``cp_comm_type="p2p"``.

Layout (``StepConfig.cp_balance``): with ``zigzag``, Megatron CP's load balancing for causal
masks, the sequence is cut into 2P chunks of c = S/(2P) tokens and rank r holds chunks r and
2P-1-r, in that order, so every rank's [B, S/P, H] activations cover an early and a late part of
the sequence. With ``none`` rank r holds the r-th of P contiguous chunks. Everything outside
attention is local to those tokens: projections and the MLP use replicated weights (no tensor
parallelism), and their gradients are summed over the group after backward.

Forward, per layer: Q, K and V are computed locally. K and V travel around the ring packed in
one buffer [2, B, S/P, g, d]: at each of the steps 0..P-2 every rank sends the block it holds to
rank r+1 and receives the next from rank r-1 (one ``batch_isend_irecv``), while it attends its
queries to the block in hand. Step i holds the block of rank src = r - i (mod P); which of its
queries see which of the block's keys is ``block_plan``'s:

- i = 0, its own block: causal attention over the local tokens;
- zigzag, src < r: every local query sees the first chunk of the block (chunk src), unmasked;
- zigzag, src > r: only the second local chunk (chunk 2P-1-r) sees the block, all of it, unmasked;
- none, src < r: every query sees the whole block, unmasked; src > r: nothing (the block only
  passes through), so rank r computes r + 1 blocks and rank P-1 about 2P/(P+1) times the mean;
- without a causal mask, every query sees every block.

Each step yields a partial output and its log-sum-exp; they are merged exactly (the online
softmax), so the result equals dense attention. With zigzag every step but the first does half
the work of a full block: the balance the layout exists for.

Backward runs the other way (to rank r-1, from rank r+1), starting with the block of rank r+1,
the last one forward received: K,V go around again, and with them the dK,dV accumulator of the
block a rank just worked on. Step 0 sends K,V alone, the middle steps K,V with the accumulator in
one buffer, the last step the accumulator alone: P-1 transfers of each, and the last accumulator
to arrive is the rank's own block's, complete. dQ stays local. Saved for backward: q, the last
K,V block received, the output and the final log-sum-exp (per query and head), as
TransformerEngine saves them; the other K,V blocks in flight are transient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from sptrace.reference_models import comm_ops
from sptrace.reference_models.config import StepConfig
from sptrace.reference_models.layers import CHECKPOINT_HOOKS, apply_rope, split_grouped_qkv
from sptrace.reference_models.ulysses import UlyssesBlock
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sptrace.vocab import markers

_KV_TAG = 1  # gloo pairs a send with its recv by tag; NCCL ignores tags


def zigzag_positions(seq: int, rank: int, size: int) -> Tensor:
    """Global token positions a rank holds in the zigzag layout: chunks ``rank`` and
    ``2*size-1-rank`` of 2*size equal chunks."""
    c = seq // (2 * size)
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * size - 1 - rank) * c, (2 * size - rank) * c)
    return torch.cat([first, second])


def ring_positions(seq: int, rank: int, size: int, balance: str) -> Tensor:
    """Global token positions a rank of the ring holds: its zigzag chunks, or (balance "none")
    the rank-th of ``size`` contiguous chunks."""
    if balance == "zigzag":
        return zigzag_positions(seq, rank, size)
    n = seq // size
    return torch.arange(rank * n, (rank + 1) * n)


@dataclass(frozen=True)
class BlockPlan:
    """Which local queries (``rows``) see which keys of a K,V block in hand (``cols``), and
    whether the block is the diagonal one, masked causally."""

    rows: slice
    cols: slice
    causal: bool


_ALL = slice(None)


def block_plan(rank: int, src: int, local: int, causal: bool, balance: str) -> BlockPlan | None:
    """What rank ``rank`` computes of rank ``src``'s K,V block, each holding ``local`` tokens in
    the ``balance`` layout (module docstring); None when its queries see none of it."""
    if not causal:
        return BlockPlan(_ALL, _ALL, False)
    if src == rank:
        return BlockPlan(_ALL, _ALL, True)
    if balance == "none":
        return BlockPlan(_ALL, _ALL, False) if src < rank else None
    c = local // 2
    return BlockPlan(_ALL, slice(0, c), False) if src < rank else BlockPlan(slice(c, None), _ALL, False)


def _expand(x: Tensor, heads: int) -> Tensor:
    """[B, s, g, d] -> [B, heads, s, d] (GQA: each kv head serves heads/g query heads), fp32."""
    rep = heads // x.shape[2]
    if rep > 1:
        x = x.repeat_interleave(rep, dim=2)
    return x.transpose(1, 2).float()


def _scores(q: Tensor, k: Tensor, causal: bool) -> Tensor:
    """q [B, a, sq, d], k [B, a, sk, d] -> scaled scores [B, a, sq, sk], causally masked when
    q and k are the same tokens in the same order."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s


def _block_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """(output [B, a, sq, d], log-sum-exp [B, a, sq]) of q against one K,V block."""
    s = _scores(q, k, causal)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _merge(out: Tensor, lse: Tensor, part: Tensor, part_lse: Tensor) -> None:
    """Fold a block's partial result into the running (out, lse), in place (online softmax)."""
    new = torch.logaddexp(lse, part_lse)
    out.mul_(torch.exp(lse - new)[..., None]).add_(part * torch.exp(part_lse - new)[..., None])
    lse.copy_(new)


def _block_backward(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, lse: Tensor, delta: Tensor, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of one block (all [B, a, s, d] fp32), from the FINAL lse of the rows: the
    block's probabilities are then exact and the gradients add up over blocks."""
    scale = q.shape[-1] ** -0.5
    p = torch.exp(_scores(q, k, causal) - lse[..., None])
    dv = p.transpose(-1, -2) @ dout
    ds = p * (dout @ v.transpose(-1, -2) - delta[..., None])
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, dv


def _fold_heads(x: Tensor, kv_heads: int) -> Tensor:
    """[B, a, s, d] gradients of the expanded K or V -> [B, s, g, d] (summed over each group)."""
    B, a, s, d = x.shape
    return x.view(B, kv_heads, a // kv_heads, s, d).sum(2).transpose(1, 2)


class _Ring:
    """One rank's view of the ring: its group rank, size and neighbours' global ranks."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        if group is None:  # a ring of one rank (USP with U = P): attention is local
            self.size, self.rank, self.next, self.prev = 1, 0, -1, -1
            return
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def exchange(self, send: Tensor, recv: Tensor, to: int, source: int, tag: int) -> list[dist.Work]:
        """Send ``send`` to global rank ``to`` and receive ``recv`` from ``source``, in one
        ``batch_isend_irecv`` (TransformerEngine's ``flash_attn_p2p_communicate`` batched)."""
        ops = [
            dist.P2POp(dist.isend, send, to, self.group, tag),
            dist.P2POp(dist.irecv, recv, source, self.group, tag),
        ]
        return dist.batch_isend_irecv(ops)


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


class RingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None, tag: str, causal: bool, balance: str
    ) -> Tensor:
        """q [B, S/P, a, d], k, v [B, S/P, g, d] in the ``balance`` layout -> [B, S/P, a, d]."""
        ring = _Ring(group)
        P, r, a, local = ring.size, ring.rank, q.shape[2], q.shape[1]
        qf = q.transpose(1, 2).float()  # [B, a, s, d]
        blocks = [torch.stack([k, v]), torch.empty((2, *k.shape), dtype=k.dtype, device=k.device)]
        out = lse = None
        for i in range(P):
            held = blocks[i % 2]
            works = []
            if i < P - 1:
                with comm_ops.annotate(markers.comm_name(tag, f"ring_kv_step{i}")):
                    works = ring.exchange(held, blocks[(i + 1) % 2], ring.next, ring.prev, _KV_TAG)
            plan = block_plan(r, (r - i) % P, local, causal, balance)
            if plan is not None:
                kb, vb = _expand(held[0][:, plan.cols], a), _expand(held[1][:, plan.cols], a)
                part = _block_forward(qf[:, :, plan.rows], kb, vb, plan.causal)
                if i == 0:  # its own block: every query, first
                    out, lse = part
                else:
                    _merge(out[:, :, plan.rows], lse[:, :, plan.rows], *part)
            _wait(works)
        assert out is not None and lse is not None
        result = out.transpose(1, 2).to(q.dtype)
        # the block in hand at the end (rank r+1's) starts the backward ring, as in TransformerEngine
        ctx.save_for_backward(q, blocks[(P - 1) % 2], result, lse)
        ctx.group, ctx.tag, ctx.causal, ctx.balance = group, tag, causal, balance
        return result

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, last_kv, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        P, r, a, g, local = ring.size, ring.rank, q.shape[2], last_kv.shape[3], q.shape[1]
        qf, dof = q.transpose(1, 2).float(), dout.transpose(1, 2).float()
        delta = (dof * out.transpose(1, 2).float()).sum(-1)  # [B, a, s]
        dq = torch.zeros_like(qf)
        # buffers[j]: [0] the K,V block in hand, [1] the dK,dV accumulator of the previous step's
        # block; they travel the reverse way (to rank r-1), in one send where both go
        buffers = [torch.empty((2, *last_kv.shape), dtype=last_kv.dtype, device=last_kv.device) for _ in range(2)]
        buffers[0][0].copy_(last_kv)
        for i in range(P):
            now, after = buffers[i % 2], buffers[(i + 1) % 2]
            works = []
            if P > 1:  # step 0 sends K,V only, the last step dK,dV only, the others both
                send = now[:1] if i == 0 else now[1:] if i == P - 1 else now
                recv = after[:1] if i == 0 else after[1:] if i == P - 1 else after
                with comm_ops.annotate(markers.comm_name(ctx.tag, f"ring_kv_dkv_step{i}")):
                    works = ring.exchange(send, recv, ring.prev, ring.next, _KV_TAG)
            # the block in hand: forward step P-1-i's
            plan = block_plan(r, (r + 1 + i) % P, local, ctx.causal, ctx.balance)
            dk = qf.new_zeros(qf.shape[0], a, local, qf.shape[-1])
            dv = torch.zeros_like(dk)
            if plan is not None:
                rows, cols = plan.rows, plan.cols
                kb, vb = _expand(now[0, 0][:, cols], a), _expand(now[0, 1][:, cols], a)
                dq_, dk[:, :, cols], dv[:, :, cols] = _block_backward(
                    qf[:, :, rows], kb, vb, dof[:, :, rows], lse[:, :, rows], delta[:, :, rows], plan.causal
                )
                dq[:, :, rows] += dq_
            share = torch.stack([_fold_heads(dk, g), _fold_heads(dv, g)])  # [2, B, S/P, g, d]
            _wait(works)
            # the accumulator of this block arrived from rank r+1 (which held it one step before)
            if i > 0:
                share += after[1].float()
            after[1].copy_(share)  # sent to rank r-1 at the next step; the owner's at the last
        dkv = buffers[P % 2][1]
        return dq.transpose(1, 2).to(q.dtype), dkv[0], dkv[1], None, None, None, None


def ring_attention(
    q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None, tag: str = "", causal: bool = True,
    balance: str = "zigzag",
) -> Tensor:  # fmt: skip
    """Attention of the sequence sharded in the ``balance`` layout over the ring ``group`` (None:
    one rank), causal unless told otherwise."""
    return RingAttentionFunction.apply(q, k, v, group, tag, causal, balance)


class RingAttention(nn.Module):
    """Replicated projections on the local tokens (zigzag or contiguous), RoPE at their global
    positions, and ring attention over the group."""

    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__()
        a, g, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.cfg, self.group = cfg, group
        self.qkv = nn.Linear(cfg.hidden, (a + 2 * g) * d, bias=False)
        self.proj = nn.Linear(a * d, cfg.hidden, bias=False)
        self.recompute = cfg.recompute == "selective"
        self.tag = ""

    def _ring(self, q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        """Ring attention, checkpointed with selective recomputation (Megatron's core attention
        with context parallelism): its forward ring runs again in backward."""
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(ring_attention, q, k, v, group, self.tag, self.cfg.causal, self.cfg.cp_balance,
                              use_reentrant=False, **CHECKPOINT_HOOKS)  # fmt: skip
        return ring_attention(q, k, v, group, self.tag, self.cfg.causal, self.cfg.cp_balance)

    def _core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self._ring(q, k, v, self.group)

    def positions(self, device: torch.device) -> Tensor:
        """Global positions of this rank's tokens (for RoPE)."""
        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)
        return ring_positions(self.cfg.seq, rank, size, self.cfg.cp_balance).to(device)

    def forward(self, x: Tensor) -> Tensor:  # [B, S/P, H]
        cfg = self.cfg
        q, k, v = split_grouped_qkv(self.qkv(x), cfg.kv_heads, cfg.heads // cfg.kv_heads, cfg.head_dim)
        positions = self.positions(x.device)
        q, k = apply_rope(q, positions), apply_rope(k, positions)
        return self.proj(self._core(q, k, v).flatten(2))


class RingBlock(UlyssesBlock):
    """A pre-norm block whose attention is the ring's; norms and MLP local (replicated weights)."""

    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__(cfg, group)
        self.attn = RingAttention(cfg, group)


# ---- USP: Ulysses inside a group of U ranks, the ring across P/U of them ----------------------

_SUBGROUPS: dict[tuple[int, ...], dist.ProcessGroup] = {}


def _subgroup(ranks: list[int]) -> dist.ProcessGroup:
    """The process group of these global ranks, created once by its members alone."""
    key = tuple(ranks)
    if key not in _SUBGROUPS:
        _SUBGROUPS[key] = dist.new_group(list(key), use_local_synchronization=True)
    return _SUBGROUPS[key]


def release_subgroups() -> None:
    """Destroy the subgroups this process created, so that the next run of a shared launch
    records only its own groups in its trace (``distributedInfo.pg_config``)."""
    for group in _SUBGROUPS.values():
        dist.destroy_process_group(group)
    _SUBGROUPS.clear()


def usp_groups(
    group: dist.ProcessGroup, ulysses_degree: int
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """(Ulysses group, ring group) of this rank in ``group``: group rank j*U + u is rank u of
    Ulysses group j and rank j of ring group u (Ulysses on neighbouring ranks, inside a node,
    as long-context-attention's default ``use_ulysses_low`` places it). A group of one rank is
    None: it would communicate nothing, and a trace holding such a group cannot tell which of a
    rank's groups a collective ran in."""
    U, P = ulysses_degree, dist.get_world_size(group)
    rank = dist.get_rank(group)
    j, u = divmod(rank, U)
    members = [dist.get_global_rank(group, i) for i in range(P)]
    ulysses = _subgroup([members[j * U + i] for i in range(U)]) if U > 1 else None
    ring = _subgroup([members[i * U + u] for i in range(P // U)]) if P // U > 1 else None
    return ulysses, ring


def usp_positions(seq: int, rank: int, size: int, ulysses_degree: int, balance: str = "zigzag") -> Tensor:
    """Global token positions of group rank ``rank``: its ring rank's tokens (zigzag chunks of
    2P/U, or the contiguous chunk of P/U), cut into U consecutive slices, the u-th one."""
    U = ulysses_degree
    j, u = divmod(rank, U)
    ring_tokens = ring_positions(seq, j, size // U, balance)
    n = seq // size
    return ring_tokens[u * n : (u + 1) * n]


class USPAttention(RingAttention):
    """All-to-all (sequence -> heads) over the Ulysses group, ring attention over the ring group
    on [B, S*U/P, a/U, d], and the all-to-all back (feifeibear/long-context-attention's USP)."""

    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__(cfg, group)
        self.ulysses_group, self.ring_group = usp_groups(group, cfg.ulysses_degree)

    def _core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        U, tag, ulysses = self.cfg.ulysses_degree, self.tag, self.ulysses_group
        if ulysses is None:  # U = 1: the ring alone
            return self._ring(q, k, v, self.ring_group)
        if k.shape[2] < U:  # GQA with g < U: one kv head per Ulysses rank, as DeepSpeed does
            k = k.repeat_interleave(U // k.shape[2], dim=2)
            v = v.repeat_interleave(U // v.shape[2], dim=2)
        q = comm_ops.all_to_all_seq_to_heads(q, ulysses, f"{tag}::q")  # [B, S*U/P, a/U, d]
        k = comm_ops.all_to_all_seq_to_heads(k, ulysses, f"{tag}::k")
        v = comm_ops.all_to_all_seq_to_heads(v, ulysses, f"{tag}::v")
        ctx = self._ring(q, k, v, self.ring_group)
        return comm_ops.all_to_all_heads_to_seq(ctx, ulysses, f"{tag}::context")  # [B, S/P, a, d]

    def positions(self, device: torch.device) -> Tensor:
        P, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        return usp_positions(self.cfg.seq, rank, P, self.cfg.ulysses_degree, self.cfg.cp_balance).to(device)


class USPBlock(UlyssesBlock):
    def __init__(self, cfg: StepConfig, group: dist.ProcessGroup) -> None:
        super().__init__(cfg, group)
        self.attn = USPAttention(cfg, group)
