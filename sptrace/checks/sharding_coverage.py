"""What the sharding verdict covered (sptrace.checks.sharding_verdict): the ranks, layers, steps
and forward/backward boundaries its retained tensors came from, and which ranks recorded memory
events, saved-tensor records and sptrace.instrument's census; and the same in one line of text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import pandas as pd

from sptrace.detect.allocations import Retention
from sptrace.vocab.units import count, rank_ranges


class Coverage(TypedDict):
    """What the verdict covered (ShardingReport.coverage, the JSON ``coverage`` object)."""

    ranks: list[int]
    missing_ranks: list[int]
    """Ranks of the run without a trace."""
    layers: list[int]
    boundaries: int
    steps: list[int]
    memory_events: list[int]
    """The ranks whose trace has [memory] events."""
    saved_records: list[int]
    census: list[int]
    tensors: int


def coverage_of(retained: list[Retention], saved: pd.DataFrame, missing: Sequence[int]) -> Coverage:
    layers = sorted(set().union(*(r.layers_seen for r in retained)) | {int(x) for x in saved["layer"].dropna()})
    return {
        "ranks": sorted(r.rank for r in retained),
        "missing_ranks": sorted(missing),
        "layers": layers,
        "boundaries": sum(len(r.boundaries) for r in retained),
        "steps": sorted({b.step for r in retained for b in r.boundaries if b.step is not None}),
        "memory_events": sorted(r.rank for r in retained if r.has_memory),
        "saved_records": sorted(r.rank for r in retained if r.has_records),
        "census": sorted(r.rank for r in retained if r.has_census),
        "tensors": len(saved),
    }


def covered_text(coverage: Coverage) -> str:
    """'8 ranks (0-7), layers 0-2, 2 steps, memory events on every rank'"""
    ranks = coverage["ranks"]
    parts = [f"{count(len(ranks), 'rank')} ({rank_ranges(ranks)})" if ranks else "no rank"]
    if coverage["layers"]:
        parts.append(f"layer{'s' if len(coverage['layers']) > 1 else ''} {rank_ranges(coverage['layers'])}")
    if len(coverage["steps"]) > 1:
        parts.append(f"{len(coverage['steps'])} steps")
    if coverage["boundaries"] > max(len(ranks), 1) * max(len(coverage["steps"]), 1):
        parts.append(f"{coverage['boundaries']} forward/backward boundaries")
    with_memory = coverage["memory_events"]
    parts.append("memory events on every rank" if with_memory == ranks
                 else f"memory events on {count(len(with_memory), 'rank')} of {len(ranks)}")  # fmt: skip
    return ", ".join(parts)
