"""Across ranks: each rank's tables (sptrace.detect) -> the run's, before the checks judge them.

- ``peers``: the ranks' collectives merged, with what one rank's trace cannot say (an element
  type, a peer, a receive's phase) settled from the other ranks' traces;
- ``pairing``: the one pairing of sends with receives;
- ``matching``: the same collective on every rank of its group, arrival skew and stragglers;
- ``p2p``: point-to-point pairs, ring steps, overlap and balance;
- ``timebase``: the one time base: arrival, end, transfer time, bandwidth, clock offsets.

It reads ``detect`` and ``load`` (and the cost model's wire-byte formula, for an element type
filled from a peer); neither reads it.
"""
