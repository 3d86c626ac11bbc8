"""How a retained tensor's shape reads against the declared model (B, S, H, P, and a, g, F
when declared), for the sharding check's Judge (sptrace.checks.sharding): the per-token widths
the declared dims allow, whole and as 1/P shards (``widths``), every way a shape reads as tokens
x width (``readings``), and how many heads a head axis holds (``heads_of``)."""

from __future__ import annotations

import math
from typing import NamedTuple

from sptrace.vocab.shape import ModelShape


class Reading(NamedTuple):
    """One way a shape reads as tokens x width."""

    full_seq: bool
    """The whole sequence (S tokens), else a sequence shard (S/P)."""
    width: int
    """Elements per token."""
    layout: str
    """How the dims read: '[B, S, ...]', '[B, h, S, d]', ..."""
    scores: bool
    """Attention scores: the sequence once more as the last axis (keys across the sequence)."""


def widths(m: ModelShape) -> tuple[dict[int, str], dict[int, str]]:
    """Per-token widths of whole tensors, and of 1/P tensor-parallel shards, that the declared
    dims allow: {width: what}."""
    H, P = m.hidden, m.sp_size
    whole: dict[int, str] = {H: "H"}
    shard: dict[int, str] = {}
    if H % P == 0:
        shard[H // P] = "H/P"
    d = m.head_dim
    if m.heads and d:
        whole.setdefault(m.heads * d, "a*d")
        if m.heads % P == 0:
            shard.setdefault(m.heads // P * d, "a*d/P")
        if m.kv_heads:
            g = m.kv_heads
            whole.setdefault(g * d, "g*d")
            whole.setdefault((m.heads + 2 * g) * d, "(a+2g)*d")
            if g % P == 0:
                shard.setdefault(g // P * d, "g*d/P")
            if (m.heads + 2 * g) % P == 0:
                shard.setdefault((m.heads + 2 * g) // P * d, "(a+2g)*d/P")
    if m.ffn:
        whole.setdefault(m.ffn, "F")
        whole.setdefault(2 * m.ffn, "2F")  # gated MLPs (SwiGLU) fuse gate and up
        if m.ffn % P == 0:
            shard.setdefault(m.ffn // P, "F/P")
            shard.setdefault(2 * m.ffn // P, "2F/P")
    return whole, shard


def readings(m: ModelShape, shape: tuple[int, ...], chunked: bool = True) -> list[Reading]:
    """Every way ``shape`` reads as tokens x width (``Reading``). A shape can read several ways
    when dimensions coincide (S == H, B == P, B*S == H): each reading is kept, and the class must
    agree across them.
    ``chunked``: also read the sequence as P chunks of S/P on two axes (an all-to-all's or a
    gather's buffer); never for a tensor a point-to-point receive filled, which holds one
    peer's block, whatever a leading axis of P coincides with (K and V stacked at P = 2)."""
    B, S, P = m.batch, m.seq, m.sp_size
    s_local = S // P
    seqs = {S: True}
    if P > 1:
        seqs.setdefault(s_local, False)
    n = len(shape)
    out: list[Reading] = []

    def add(axis: int, width_dims: tuple[int, ...], layout: str) -> None:
        full = seqs[shape[axis]]
        width = math.prod(width_dims)
        heads_first = layout in ("[B, h, S, d]", "[B*h, S, d]")
        if not (heads_first and shape[-1] == S and S != m.head_dim):  # [B, h, S, S] is scores only
            out.append(Reading(full, width, layout, False))
        # the sequence once more as the last axis: attention scores (keys across the sequence)
        if n >= 3 and axis != n - 1 and shape[-1] == S and S > 1:
            out.append(Reading(full, width, layout, True))

    if n >= 2 and shape[0] == B and shape[1] in seqs:
        add(1, shape[2:], "[B, S, ...]")
    if n >= 2 and shape[1] == B and shape[0] in seqs:
        add(0, shape[2:], "[S, B, ...]")
    if n == 4 and shape[0] == B and shape[2] in seqs and head_axis(m, shape[1], shape[3]):
        add(2, (shape[1], shape[3]), "[B, h, S, d]")
    if n >= 1 and B > 1 and shape[0] in (B * S, B * s_local):
        out.append(Reading(shape[0] == B * S and P > 1, math.prod(shape[1:]), "[B*S, ...]", False))
    if n >= 1 and B == 1 and shape[0] in seqs:
        add(0, shape[1:], "[S, ...]")
    if n == 3 and shape[1] in seqs and shape[0] % B == 0 and shape[0] != B and head_axis(m, shape[0] // B, shape[2]):
        add(1, (shape[0] // B, shape[2]), "[B*h, S, d]")
    if chunked and P > 1 and n >= 3 and not any(not v.full_seq and v.width == m.hidden for v in out):
        # (not where the shape already reads as an exact [S/P, B, H] shard, as the all-to-all
        # that brings the heads home leaves it when P == S/P)
        # the sequence as P chunks of S/P on two axes: an all-to-all's buffer (DeepSpeed-Ulysses
        # lays q, k, v out as [P, S/P, B, h/P, d] sequence-first, [P, B, S/P, h/P, d] and
        # [B, P, S/P, ...] batch-first); the whole sequence, whatever each axis alone reads as
        for axes, layout in (((0, 1), "[P, S/P, B, ...]"), ((0, 2), "[P, B, S/P, ...]"),
                             ((1, 2), "[B, P, S/P, ...]")):  # fmt: skip
            batch_axis = ({0, 1, 2} - set(axes)).pop()
            if shape[axes[0]] == P and shape[axes[1]] == s_local and shape[batch_axis] == B:
                out.append(Reading(True, math.prod(shape[3:]), layout, False))
    if m.heads and any(v.layout == "[B, h, S, d]" for v in out):
        # declared heads matched one more axis than a [B, S, ...] reading: the more specific wins
        out = [v for v in out if v.layout == "[B, h, S, d]"]
    return out


def head_axis(m: ModelShape, h: int, d: int) -> bool:
    """Could (h, d) be a head count and a head dim? Any, unless the heads are declared."""
    if not m.heads:
        return True
    counts = {m.heads, m.heads // m.sp_size or 1}
    if m.kv_heads:
        counts |= {m.kv_heads, max(m.kv_heads // m.sp_size, 1)}
    return h in counts and (m.head_dim is None or d in (m.head_dim, m.seq))


def tokens_of(m: ModelShape, reading: Reading) -> int:
    """The tokens a reading spans: B*S for the whole sequence, B*S/P for a shard."""
    return m.batch * (m.seq if reading.full_seq else m.local_seq)


def heads_of(m: ModelShape, shape: tuple[int, ...], tokens: int) -> str | None:
    """For layouts with a head axis ([B, S, h, d], [B, h, S, d], [S, B, h, d]) and the head
    counts declared: 'all' heads (a, or g kv heads), a 1/P 'share', or None (either, or neither)."""
    d, P = m.head_dim, m.sp_size
    if len(shape) < 3 or not (m.heads and d) or d not in shape:
        return None
    rest = math.prod(shape) // tokens
    if rest % d:
        return None
    h = rest // d
    whole = {m.heads} | ({m.kv_heads} if m.kv_heads else set())
    share = {m.heads // P} if m.heads % P == 0 else set()
    if m.kv_heads:
        share |= {m.kv_heads // P} if m.kv_heads % P == 0 else {max(m.kv_heads, P) // P}  # kv replicated up to P
    if h in share and h not in whole:
        return "share"
    if h in whole and h not in share:
        return "all"
    return None
