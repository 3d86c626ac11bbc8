"""The map's results gathered as they arrive (``GatheredRanks``): what the cross-rank reduce needs
from every rank, and no more, held in memory that hardly grows with the rank count.

A rank's RankResult (sptrace.run.map) is a few frames of a few hundred rows each, and a pandas
frame costs kilobytes of its own: a thousand ranks' results held as they come are most of a
driver's memory. Gathered, they are

- the small frames every cross-rank stage reads whole (collectives, phases, the memory series,
  module times, the lane per step, FLOPs): a few concatenated chunks each (``FrameChunks``);
- the per-rank totals: timing, peak allocated memory;
- what only some stages read, rank by rank (the work lanes the critical path walks, compute
  intervals, retained tensors): ``SpooledRanks``, on disk past a few dozen ranks;
- each rank's released trace, its metadata's equal values shared across ranks (``share_equal``).

The descriptions (``sptrace info``'s counts) are kept only when asked for.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

from sptrace.run.spool import FrameChunks, SpooledRanks

if TYPE_CHECKING:
    import pandas as pd

    from sptrace.detect.allocations import Retention
    from sptrace.detect.timing import RankTiming
    from sptrace.load.describe import RankDescription
    from sptrace.load.trace import RankTrace
    from sptrace.run.map import RankResult

PHASE_COLUMNS = ["rank", "phase", "start_us", "dur_us"]
MEMORY_COLUMNS = ["rank", "ts_us", "allocated_bytes"]
COMPUTE_COLUMNS = ["rank", "start_us", "dur_us"]


def _frames(columns: list[str]) -> FrameChunks:
    return FrameChunks(columns)


@dataclass(eq=False)
class GatheredRanks:
    """Every rank's RankResult, taken one at a time (``take``) in any order; read in rank order."""

    keep_descriptions: bool = False
    collectives: FrameChunks = field(default_factory=lambda: _frames([]))
    phases: FrameChunks = field(default_factory=lambda: _frames(PHASE_COLUMNS))
    memory: FrameChunks = field(default_factory=lambda: _frames(MEMORY_COLUMNS))
    module_times: FrameChunks = field(default_factory=lambda: _frames([]))
    step_work: FrameChunks = field(default_factory=lambda: _frames([]))
    flops: FrameChunks = field(default_factory=lambda: _frames([]))
    timing: dict[int, RankTiming] = field(default_factory=dict)
    peak_allocated: dict[int, int] = field(default_factory=dict)
    compute: SpooledRanks[pd.DataFrame] = field(default_factory=SpooledRanks)
    work: SpooledRanks[pd.DataFrame] = field(default_factory=SpooledRanks)
    """Each rank's work lane (sptrace.detect.work): the critical path's and the replays' input."""
    retained: SpooledRanks[Retention] = field(default_factory=SpooledRanks)
    descriptions: dict[int, RankDescription] = field(default_factory=dict)
    _shared: dict[bytes, object] = field(default_factory=dict, repr=False)

    def take(self, result: RankResult) -> RankTrace:
        """Keep what the reduce needs of ``result``; its trace (metadata shared), for the run."""
        trace = result.trace
        rank = int(trace.rank) if trace.rank is not None else 0
        trace.metadata = share_equal(trace.metadata, self._shared)  # type: ignore[assignment]
        if trace.stats is not None:
            trace.stats = share_equal(trace.stats, self._shared)  # type: ignore[assignment]
        if self.keep_descriptions and result.description is not None:
            self.descriptions[rank] = result.description
        for name in ("collectives", "phases", "memory", "module_times", "step_work", "flops"):
            frame = getattr(result, name)
            if frame is not None:
                getattr(self, name).append(frame)
        if result.timing is not None:
            self.timing[rank] = result.timing
        if result.peak_allocated is not None:
            self.peak_allocated[rank] = result.peak_allocated
        for name in ("compute", "work", "retained"):
            value = getattr(result, name)
            if value is not None:
                getattr(self, name).put(rank, value)
        return trace

    def ranked_timing(self) -> tuple[RankTiming, ...]:
        return tuple(self.timing[r] for r in sorted(self.timing))

    def ranked_retained(self) -> RankedValues[Retention]:
        return RankedValues(self.retained)

    def frame(self, name: str) -> pd.DataFrame:
        """The ranks' frames of ``name`` as one, in rank order (each rank's rows in its order)."""
        frame = getattr(self, name).frame()
        if len(frame) and "rank" in frame.columns and not frame["rank"].is_monotonic_increasing:
            frame = frame.sort_values("rank", kind="stable").reset_index(drop=True)
        return frame


def gather_results(results: Iterable[RankResult]) -> GatheredRanks:
    """Results already held (a loaded run's, summarized in this process), gathered."""
    gathered = GatheredRanks()
    for result in results:
        gathered.take(result)
    return gathered


def joined(frames: Mapping[int, pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    """rank -> frame (a SpooledRanks of lanes) as one frame in rank order (``columns`` when empty)."""
    import pandas as pd

    kept = [f for f in (frames[r] for r in sorted(frames)) if len(f)]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=columns)


class RankedValues(Sequence):  # type: ignore[type-arg]
    """A SpooledRanks' values in rank order, read one at a time (a spilled store stays on disk)."""

    def __init__(self, store: SpooledRanks) -> None:  # type: ignore[type-arg]
        self._store, self._ranks = store, sorted(store)

    def __len__(self) -> int:
        return len(self._ranks)

    @overload
    def __getitem__(self, i: int) -> object: ...
    @overload
    def __getitem__(self, i: slice) -> list[object]: ...
    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self._store[r] for r in self._ranks[i]]
        return self._store[self._ranks[i]]

    def __iter__(self) -> Iterator[object]:
        return (self._store[r] for r in self._ranks)


_ATOMS = (str, int, float, bool, type(None))


def share_equal(value: object, shared: dict[bytes, object]) -> object:
    """``value`` (JSON-like: dicts, lists, tuples, atoms) with each container equal to one seen
    before replaced by that one: the ranks of a job carry the same device properties, process
    groups and category names, held once. The containers are treated as read-only afterwards."""
    if isinstance(value, _ATOMS):
        return value
    try:
        key = hashlib.blake2b(pickle.dumps(value, 5), digest_size=16).digest()
    except Exception:  # (not a JSON-like value: kept as it is)
        return value
    seen = shared.get(key)
    if seen is not None:
        return seen
    if isinstance(value, dict):
        value = {k: share_equal(v, shared) for k, v in value.items()}
    elif isinstance(value, list):
        value = [share_equal(v, shared) for v in value]
    elif isinstance(value, tuple):
        value = tuple(share_equal(v, shared) for v in value)
    shared[key] = value
    return value
