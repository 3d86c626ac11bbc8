"""Ring attention (TransformerEngine's AttnFuncWithCPAndKVP2P, cp_comm_type "p2p", zigzag
layout): K,V blocks travel around the ring by P2P; everything outside attention is local with
replicated weights."""

from __future__ import annotations

from sptrace.costmodel.spec import Builder


def _block(b: Builder, tokens: int, kv_heads: int) -> tuple[int, ...]:
    """K and V of a ring rank's tokens packed in one buffer; GQA kv heads travel unreplicated."""
    return (2, b.cfg.batch, tokens, kv_heads, b.cfg.head_dim)


def _step(b: Builder, phase: str, shape: tuple[int, ...], ranks: int, send: str, recv: str) -> None:
    """One ring step: a batched isend to one neighbour and irecv from the other, as two specs."""
    b.add(phase, "send", "attn", send, shape, shape, group=ranks)
    b.add(phase, "recv", "attn", recv, shape, shape, group=ranks)


def p2p_forward(b: Builder, ranks: int, tokens: int, kv_heads: int, *, phase: str = "forward") -> None:
    """Steps 0..R-2: each rank passes the K,V block it holds to rank r+1 (it needs no block
    after the last step, hence R-1 transfers). ``tokens`` and ``kv_heads`` are what one ring
    rank holds (S/P and g for ring; S/R and max(g/U, 1) for usp). ``phase`` backward: the
    forward ring run again by selective recomputation, before the backward ring."""
    block = _block(b, tokens, kv_heads)
    again = "recomputed " if phase == "backward" else ""
    for i in range(ranks - 1):
        _step(
            b,
            phase,
            block,
            ranks,
            f"{again}ring step {i}: send of the K,V block to rank r+1",
            f"{again}ring step {i}: recv of the K,V block from rank r-1",
        )


def p2p_recompute(b: Builder, ranks: int, tokens: int, kv_heads: int) -> None:
    """Selective recomputation checkpoints the ring attention: its forward ring runs again at
    the start of its backward."""
    if b.cfg.recompute == "selective":
        p2p_forward(b, ranks, tokens, kv_heads, phase="backward")


def p2p_backward(b: Builder, ranks: int, tokens: int, kv_heads: int) -> None:
    """R steps the reverse way (to rank r-1): K,V go around again and the dK,dV accumulator of
    the previous step's block rides in the same buffer; step 0 has no accumulator yet and the
    last step sends the accumulator home alone. One rank: no P2P."""
    if ranks <= 1:
        return
    block = _block(b, tokens, kv_heads)
    for i in range(ranks):
        if i == 0:
            shape, what = block, "K,V block"
        elif i == ranks - 1:
            shape, what = block, "dK,dV accumulator"
        else:
            shape, what = (2, *block), "K,V block and dK,dV accumulator"
        _step(
            b,
            "backward",
            shape,
            ranks,
            f"ring step {i}: send of the {what} to rank r-1",
            f"ring step {i}: recv of the {what} from rank r+1",
        )


def collectives(b: Builder, *, attention_only: bool) -> None:
    """One layer's P2P in execution order (the MLP is local)."""
    P, S, g = b.cfg.sp_size, b.cfg.seq, b.cfg.kv_heads
    p2p_forward(b, P, S // P, g)
    p2p_recompute(b, P, S // P, g)
    p2p_backward(b, P, S // P, g)
