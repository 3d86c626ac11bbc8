"""DeepSpeed-Ulysses: all-to-alls around core attention (sequence -> heads before it, back after
it); everything else local with replicated weights (SPEC.md §1)."""

from __future__ import annotations

from sptrace.costmodel.spec import Builder


def _kv_heads(b: Builder, group: int) -> int:
    """kv heads after replication: at least one per rank of the group."""
    return max(b.cfg.kv_heads, group)


def qkv_forward(b: Builder, group: int, *, who: str = "DeepSpeed HF") -> None:
    """All-to-alls of q, k, v over ``group`` ranks (all P for Ulysses, U for usp): a rank's S/P
    tokens of every head in, S*group/P tokens of heads/group heads out."""
    B, S, P, a, g, d = b.cfg.batch, b.cfg.seq, b.cfg.sp_size, b.cfg.heads, b.cfg.kv_heads, b.cfg.head_dim
    kv = _kv_heads(b, group)
    if g < group:
        b.notes.append(f"kv heads replicated from {g} to {group} before the all-to-all ({who})")
    for t, heads in (("q", a), ("k", kv), ("v", kv)):
        b.add(
            "forward",
            "all_to_all",
            "attn",
            f"all-to-all of {t}: sequence -> heads",
            (B, S // P, heads, d),
            (B, S // P * group, heads // group, d),
            group=group,
        )


def context_forward(b: Builder, group: int) -> None:
    """The all-to-all of core attention's output back to the rank's tokens."""
    B, S, P, a, d = b.cfg.batch, b.cfg.seq, b.cfg.sp_size, b.cfg.heads, b.cfg.head_dim
    b.add(
        "forward",
        "all_to_all",
        "attn",
        "all-to-all of the context: heads -> sequence",
        (B, S // P * group, a // group, d),
        (B, S // P, a, d),
        group=group,
    )


def context_backward(b: Builder, group: int) -> None:
    """The inverse of context_forward, first in backward."""
    B, S, P, a, d = b.cfg.batch, b.cfg.seq, b.cfg.sp_size, b.cfg.heads, b.cfg.head_dim
    b.add(
        "backward",
        "all_to_all",
        "attn",
        "inverse all-to-all of context's gradient",
        (B, S // P, a, d),
        (B, S // P * group, a // group, d),
        group=group,
    )


def qkv_backward(b: Builder, group: int) -> None:
    """The inverses of qkv_forward, in the order autograd runs them (v, k, q)."""
    B, S, P, a, d = b.cfg.batch, b.cfg.seq, b.cfg.sp_size, b.cfg.heads, b.cfg.head_dim
    kv = _kv_heads(b, group)
    for t, heads in (("v", kv), ("k", kv), ("q", a)):
        b.add(
            "backward",
            "all_to_all",
            "attn",
            f"inverse all-to-all of {t}'s gradient",
            (B, S // P * group, heads // group, d),
            (B, S // P, heads, d),
            group=group,
        )


def attention_forward(b: Builder, group: int) -> None:
    qkv_forward(b, group)
    context_forward(b, group)


def attention_backward(b: Builder, group: int) -> None:
    context_backward(b, group)
    qkv_backward(b, group)


def collectives(b: Builder, *, attention_only: bool) -> None:
    """One layer's collectives in execution order: the MLP is local, so attention's alone."""
    P = b.cfg.sp_size
    attention_forward(b, P)
    attention_backward(b, P)
