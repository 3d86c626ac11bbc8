"""Who holds an allocation that is alive at a forward -> backward boundary, from evidence alone.

Holders (``HOLDERS``):
  autograd    it was saved for backward: an sptrace.saved record names it, or it was freed inside
              an autograd node during backward;
  model       the model's own code keeps it: freed outside autograd after the boundary (during
              backward, or after it), or never freed within the trace though no collective call
              had it (then nothing but the model can hold it: a Python reference, a hook, a cache);
  backend     a collective call's own tensor that the backend released on its thread (its free is
              not in the trace but its address was reused, or it was freed inside the backend's
              annotation, or torch's own function joined it and returned: library_joins), or a
              tensor the call only read, whose free is missing because gloo and NCCL drop their
              reference on a thread the profiler does not record;
  offloaded   a copy that a saved-tensor pack hook made of what autograd saves (save_on_cpu, a hook
              that copies), kept for backward in its place (sptrace.detect.pack_copies);
  parameter   its storage was allocated before this forward (a weight, a persistent buffer);
  undecided   the trace does not say: a buffer a collective filled or returned whose free is not in
              the trace (the backend's dropped reference, or one the model kept, look the same on
              a CPU trace), or an allocation freed on a thread the profiler does not record.

Where the data came from (a collective) is never who holds the memory: the backend can hold only
the exact tensors of a call (sptrace.detect.handed); everything derived from them is the model's.
On CUDA the caching allocator's Total Allocated counts every thread, so a free missing from the
events but not from the count is seen (sptrace.detect.ledger.Unrecorded); the CPU allocator counts
only the threads the profiler records, so its count shows nothing more than the events.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from sptrace.detect.boundaries import Boundary
from sptrace.detect.handed import Handed
from sptrace.detect.intervals import Intervals
from sptrace.detect.ledger import Allocation, Unrecorded
from sptrace.detect.library_joins import LibraryJoins
from sptrace.vocab.markers import ReleasedCensus

HOLDERS = ("autograd", "model", "offloaded", "backend", "parameter", "undecided")
KEEPERS = ("autograd", "model", "offloaded")
"""Holders whose full-size tensor breaks the contract: what the step itself keeps for backward."""

BACKEND_THREADS = ("gloo:", "nccl:")
"""Annotations the backends record on their own threads around a call's work."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds an allocation at a boundary, and the evidence, in words a user can check."""

    kind: str
    evidence: str

    def __post_init__(self) -> None:
        if self.kind not in HOLDERS:
            raise ValueError(f"unknown holder {self.kind!r}")

    @property
    def keeps(self) -> bool:
        """The step keeps it for backward (autograd or the model): a full-size one fails."""
        return self.kind in KEEPERS


SAVED_RECORD = Holder("autograd", "an sptrace.saved record: autograd saved it for backward")


class HolderRules:
    """Decides the holder of one rank's allocations (rows of its ledger) at a boundary."""

    def __init__(self, nodes: Intervals, backend_ranges: Intervals, unrecorded: dict[tuple[int, int], Unrecorded],
                 trace_end_ns: int, library: LibraryJoins | None = None) -> None:  # fmt: skip
        self.nodes = nodes
        """Autograd nodes (evaluate_function ranges, or an old trace's named nodes)."""
        self.backend_ranges = backend_ranges
        """gloo:* and nccl:* annotations: the backend's own work, on its threads."""
        self.unrecorded = unrecorded
        self.trace_end_ns = trace_end_ns
        self.library = library
        """Python stacks that show torch's own code joining a collective's buffer and letting go
        (sptrace.detect.library_joins)."""

    def decide(
        self, rec: Allocation, b: Boundary, handed: Handed | None, census: ReleasedCensus | None = None
    ) -> Holder:
        """``census``: who released the buffers this boundary's forward's collectives filled
        (sptrace.instrument's census, sptrace.census), where the trace has one."""
        free = rec.free_ns
        never = free is None or pd.isna(free)
        if not never and not rec.lost_free:
            return self._recorded_free(rec, int(free), b, handed)
        counted = self.unrecorded.get((int(rec.device_type), int(rec.device_id)))
        if counted is not None:  # CUDA: the allocator's count shows frees the events do not
            by_count = self._counted(rec, b, handed, counted, never)
            if by_count is not None:
                return by_count
        who = census.who(int(rec.addr)) if census is not None and handed is not None else None
        if who == "backend":
            return Holder("backend", f"{handed.describe()}; its free is not in the trace, and sptrace.instrument "
                                     "watched the backend's thread release it (the census)")  # fmt: skip
        if who == "alive" and never:
            return Holder("model", f"{handed.describe()}, and still held when the backward ended: nobody had "
                                   "released it (sptrace.instrument's census), so the model kept it")  # fmt: skip
        if not never:  # the address was allocated again: something released it unrecorded
            if handed is not None:
                return Holder("backend", f"{handed.describe()}; its free is not in the trace and its address was "
                                         "allocated again: the backend released it on its own thread")  # fmt: skip
            return Holder("undecided", "its free is not in the trace, and its address was allocated again: "
                                       "something released it on a thread the profiler does not record, before or "
                                       "after the boundary")  # fmt: skip
        if handed is None:
            return Holder("model", "never freed within the trace, and no collective call had it (a cat, copy or "
                                   "product of gathered data is the model's own): nothing but the model can hold "
                                   "it (a Python reference, a hook or a cache)")  # fmt: skip
        if handed.role == "input":
            return Holder("backend", f"{handed.describe()}, and its free is not in the trace: gloo and NCCL drop "
                                     "their reference to a call's tensors on a thread the profiler does not "
                                     "record")  # fmt: skip
        joined = self.library.evidence(handed, int(rec.bytes), b.backward_ns) if self.library is not None else None
        if joined is not None:
            return Holder("backend", f"{joined} (its free is not in the trace)")
        return Holder("undecided", f"{handed.describe()}, and its free is not in the trace: the backend's dropped "
                                   "reference (released on a thread the profiler does not record) and one the model "
                                   "kept look the same in a CPU trace")  # fmt: skip

    def _recorded_free(self, rec: Allocation, free: int, b: Boundary, handed: Handed | None) -> Holder:
        node = self.freed_in(free)
        if node is not None:
            return Holder("autograd", f"freed in {node} during backward")
        inside = self.backend_annotation(free, rec.free_tid)
        if inside is not None:
            what = handed.describe() + "; " if handed is not None else ""
            return Holder("backend", f"{what}freed inside {self.backend_ranges.name(inside)} on the backend's thread")
        if free <= b.backward_end_ns:
            return Holder("model", "freed during backward but outside any autograd node: a Python reference, a "
                                   "hook or a cache kept it across the boundary")  # fmt: skip
        return Holder("model", "alive through backward, freed after it outside autograd: a Python reference, a "
                               "hook or a cache kept it")  # fmt: skip

    def _counted(
        self, rec: Allocation, b: Boundary, handed: Handed | None, counted: Unrecorded, never: bool
    ) -> Holder | None:
        """The holder the allocator's count shows, or None where it shows nothing more than the
        events (it moved unrecorded between the allocation and the boundary)."""
        alloc = int(rec.alloc_ns)
        if never and counted.quiet(alloc, self.trace_end_ns):
            return Holder("model", "never freed: the allocator's Total Allocated shows no unrecorded free through the "
                                   "end of the trace, so something of the step still holds it")  # fmt: skip
        if not counted.quiet(alloc, b.backward_ns):
            return None
        if handed is not None:
            return Holder("backend", f"{handed.describe()}; alive at the boundary by the allocator's count, and "
                                     "released after it on a thread the profiler does not record, as NCCL's watchdog "
                                     "releases a finished call's tensors")  # fmt: skip
        return Holder("model", "alive at the boundary: its free is not in the trace, and the allocator's count shows "
                               "no unrecorded free before backward; no collective call had it")  # fmt: skip

    def backend_annotation(self, free_ns: int, free_tid: object) -> int | None:
        """The gloo:/nccl: annotation a free at ``free_ns`` on thread ``free_tid`` (NaN or None
        where unknown) happened inside: the backend's own thread released it. None otherwise."""
        if free_tid is None or pd.isna(free_tid):
            return None
        return self.backend_ranges.innermost(free_ns, free_ns, int(free_tid))

    def freed_in(self, free_ns: float | None) -> str | None:
        """The autograd node a free happened in (its name without the engine's prefix)."""
        if free_ns is None or pd.isna(free_ns):
            return None
        i = self.nodes.innermost(int(free_ns), int(free_ns))
        return None if i is None else self.nodes.name(i).rpartition(": ")[2]
