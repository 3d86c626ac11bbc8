"""How the model divides attention work among the ranks of one sequence-parallel group: what
sptrace.reduce.balance compares each rank's measured work and time against.

Megatron-SP, Ulysses and the hybrid compute attention over the whole sequence for a share of the
heads: every rank the same work. Ring attention (and USP's ring) computes a rank's queries
against every rank's K,V block; a causal mask leaves some of those blocks unseen:

- contiguous layout (``--cp-balance none``): ring rank j holds the j-th of R chunks and sees the
  blocks of ranks 0..j, its own causally, so it computes j + 1 of R blocks. Over the mean
  (R + 1)/2, rank j's share is 2(j + 1)/(R + 1), and rank R - 1's is 2R/(R + 1): 1.78x at R = 8.
  (Counted in blocks, as a kernel that computes a masked block whole does, the reference models'
  among them; a kernel that skips the masked half of the diagonal block computes j + 1/2 blocks,
  and rank R - 1 then (2R - 1)/R of the mean, 1.88x at R = 8.)
- zigzag layout (Megatron CP's load balancing): rank j holds chunks j and 2R-1-j of 2R, sees half
  of every other rank's block and its own causally: every rank the same work.
- without a causal mask every rank computes R blocks.
"""

from __future__ import annotations

from sptrace.vocab.shape import ModelShape


def ring_shares(ring_size: int, causal: bool, balance: str) -> list[float]:
    """Each ring rank's attention work over the mean (a list indexed by ring rank)."""
    R = ring_size
    if not causal or balance == "zigzag" or R < 2:
        return [1.0] * R
    return [2.0 * (j + 1) / (R + 1) for j in range(R)]


def attention_shares(model: ModelShape) -> list[float] | None:
    """Each group rank's attention work over the mean for the declared model (indexed by the rank
    in its sequence-parallel group), or None when the model leaves it open: the scheme, P, and for
    a ring the mask and the layout (and USP's Ulysses degree)."""
    P, scheme = model.sp_size, model.scheme
    if P is None or scheme is None:
        return None
    if scheme not in ("ring", "usp"):
        return [1.0] * P
    U = (model.ulysses_degree or None) if scheme == "usp" else 1
    if U is None or P % U or model.causal is None or model.cp_balance is None:
        return None
    return group_shares(P, U, model.causal, model.cp_balance)


def group_shares(sp_size: int, ulysses_degree: int, causal: bool, balance: str) -> list[float]:
    """Each group rank's attention work over the mean when the ring spans P/U of them: group rank
    g is ring rank g // U (USP's placement; U = 1 for a plain ring)."""
    ring = ring_shares(max(sp_size // ulysses_degree, 1), causal, balance)
    return [ring[g // ulysses_degree] for g in range(sp_size)]


def contiguous_causal_formula(ring_size: int) -> str:
    """The causal contiguous ring's last rank's share, as a formula with its value."""
    R = ring_size
    return f"2R/(R+1) = {2 * R / (R + 1):.2f}x at R={R}"
