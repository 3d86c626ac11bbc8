"""USP (feifeibear/long-context-attention): Ulysses all-to-alls inside groups of U ranks around
ring attention across R = P/U of them; everything else local with replicated weights."""

from __future__ import annotations

from sptrace.costmodel import ring, ulysses
from sptrace.costmodel.spec import Builder


def collectives(b: Builder, *, attention_only: bool) -> None:
    """One layer's collectives in execution order: the ring runs between the q,k,v all-to-alls
    and the context's, and in backward between their inverses."""
    P, S, U, g = b.cfg.sp_size, b.cfg.seq, b.cfg.ulysses_degree, b.cfg.kv_heads
    R = P // U
    # after the all-to-alls a ring rank holds S/R tokens of a/U heads and max(g/U, 1) kv heads
    # (kv heads replicated up to U first when g < U)
    tokens, kv = S // R, max(g // U, 1)
    a2a = U > 1  # a Ulysses group of one rank issues no all-to-all (the reference skips them)
    if a2a:
        ulysses.qkv_forward(b, U, who="USP")
    ring.p2p_forward(b, R, tokens, kv)
    if a2a:
        ulysses.context_forward(b, U)
        ulysses.context_backward(b, U)
    ring.p2p_recompute(b, R, tokens, kv)  # selective recomputation checkpoints the ring alone
    ring.p2p_backward(b, R, tokens, kv)
    if a2a:
        ulysses.qkv_backward(b, U)
