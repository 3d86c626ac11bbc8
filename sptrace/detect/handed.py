"""The exact tensors each collective call was handed or returned: the only tensors a
communication backend can hold.

gloo and NCCL keep a reference to the tensors of a call until its work completes, and drop it on
a thread of their own that the profiler does not record (gloo's worker thread, NCCL's watchdog).
When that reference is the last one, the tensor's free is missing from the trace. The backend
holds nothing else: a ``cat`` of gathered pieces, a copy, a view then ``clone``, a matmul on the
gathered tensor are the model's own allocations, whatever collective the data came from.

A Kineto trace records no tensor address in an op, only its arguments' shapes and types. A call's
tensors are found by what its thread did:
  * ``input``: a tensor the call reads (an all-reduce's, broadcast's or send's buffer, in place;
    a gather's, scatter's or all-to-all's input): the latest allocation on the call's thread,
    alive when the call starts, of exactly that argument's bytes;
  * ``output``: a buffer the caller made for the call to fill (``all_gather_into_tensor(out,
    x)``, the pieces of a list all-gather, a receive's buffer), found the same way among the
    buffers a bare allocator made outside any computing op (``torch.empty``, ``new_empty``,
    ``zeros``): a tensor an op computed (a softmax's probabilities, a matmul's product) is never a
    buffer made to be filled, whatever its bytes. Where the buffer was made before the trace
    (Megatron-Core's global memory buffer, allocated once), no allocation of the window is claimed;
  * ``returned``: what a functional collective allocated inside itself and returned;
  * ``summed``: the tensor an in-place all-reduce read and wrote (the sum the model goes on with).
What a c10d op allocates inside itself for its own use is the backend's too
(``allocations._retained_from_memory`` drops it before asking here).

Hand-written because no library reads tensor identity from a profiler trace (HTA reads kernels
and collectives, not allocations; torch's memory profiler needs the live profiler session).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sptrace.detect import forms
from sptrace.detect.alive import AliveBySize
from sptrace.detect.args import is_shape, load_list
from sptrace.detect.intervals import EventRow, Intervals
from sptrace.detect.provenance import FACTORIES, made_to_fill
from sptrace.vocab import collective_kinds, dtypes

CALLS = ("c10d::", "_c10d_functional", "record_param_comms", "symm_mem::")
"""Prefixes of the ops a rank's own thread runs to issue a collective (gloo:* and nccl:* are the
backend's annotations of the same call, on its worker thread or around its kernel)."""

_ELEMENT_SIZES = (4, 2, 8, 1)


@dataclass(frozen=True, slots=True)
class Handed:
    """One allocation a collective call was handed or returned."""

    role: str
    """input, output or returned (see the module docstring)."""
    collective: str
    """The call's op name (c10d::allreduce_ ...)."""
    call_ns: int
    """When the call started."""
    call_end_ns: int = 0
    """When the call ended."""
    tid: int | None = None
    """The thread that issued the call."""

    def describe(self) -> str:
        what = {"input": "one of the tensors", "output": "the buffer", "returned": "the tensor",
                "summed": "the tensor"}[self.role]  # fmt: skip
        how = {"input": "took", "output": "filled", "returned": "returned", "summed": "summed in place"}[self.role]
        return f"{what} {self.collective} {how}"


class HandedTensors:
    """Which ledger rows (sptrace.detect.ledger) each collective call of one rank was handed."""

    def __init__(
        self, ledger: pd.DataFrame, collectives: Intervals, element_size: int | None, slack: int,
        ops: Intervals | None = None,
    ) -> None:  # fmt: skip
        self._ops = ops
        """The rank's CPU ops (markers left out): what made each allocation (``_made_to_fill``)."""
        self._alloc = ledger["alloc_ns"].to_numpy(dtype=np.int64)
        self._free = ledger["free_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
        self._bytes = ledger["bytes"].to_numpy(dtype=np.int64)
        self._tid = ledger["tid"].to_numpy(dtype=np.float64, na_value=np.nan)
        self._sizes = AliveBySize(self._alloc, self._free, self._bytes)
        self._by_alloc = np.argsort(self._alloc, kind="stable")
        self._alloc_sorted = self._alloc[self._by_alloc]
        self._claimed_calls: list[int] = []
        """When each claimed row's call started, sorted (``_since``)."""
        self._element_size = element_size
        self._slack = slack
        self._roles: tuple[str, ...] = ()
        """The roles this pass claims."""
        self.by_row: dict[int, Handed] = {}
        # the buffers calls fill or return first, then what calls read: a ring sends its block
        # right after it allocates the next receive's buffer, and the latest allocation of the
        # send's bytes is that buffer, which the receive fills (a send never reads a fresh one)
        calls = _outermost_calls(collectives)
        for self._roles in (("output", "returned"), ("input", "summed")):
            for i in calls:
                self._find(collectives, i)

    def of(self, row: int) -> Handed | None:
        """What ledger row ``row`` was to a collective call, or None when no call had it."""
        return self.by_row.get(row)

    # ---- per call --------------------------------------------------------------------------
    def _find(self, calls: Intervals, i: int) -> None:
        name = calls.name(i)
        event = calls.row(i)
        start, end = int(calls.start[i]), int(calls.end[i])
        tid = int(calls.tid[i]) if calls.tid[i] >= 0 else None
        elem = self._element_size_of(name, event)
        form = forms.form_of(name)
        layout = form.layout if form is not None else None
        if layout in ("f_gather", "f_scatter", "f_all_to_all") or (
            name.startswith("_c10d_functional") and not name.endswith("_")
        ):  # a functional collective allocates its output and returns it
            if "returned" in self._roles:
                for row in self._made_inside(start, end, tid):
                    self._claim(row, Handed("returned", name, start, end, tid))
            self._claim_shapes(forms.input_shapes(name, event), elem, start, end, tid, "input", name)
            return
        if layout == "inplace" or (form is None and name == "record_param_comms"):
            role = "output" if form is not None and form.kind in collective_kinds.where("filled") else "input"
            if form is not None and form.kind == "all_reduce":
                role = "summed"  # read and written in place: what the model then uses is this very buffer
            shapes = forms.input_shapes(name, event) if form is not None else None
            if shapes is None and form is None:
                shapes = self._recorded_elements(event)
            self._claim_shapes(shapes, elem, start, end, tid, role, name)
            return
        if layout is None:
            return
        self._claim_shapes(forms.output_shapes(name, event), elem, start, end, tid, "output", name)
        inputs = forms.input_shapes(name, event)
        self._claim_shapes(inputs, elem, start, end, tid, "input", name)
        if layout == "gather_lists" and inputs and "output" in self._roles:  # the pieces: one per member
            for size in (elem,) if elem else _ELEMENT_SIZES:
                for row in self._pieces(math.prod(inputs[0]) * size, start, tid):
                    self._claim(row, Handed("output", name, start, end, tid))

    def _claim_shapes(
        self, shapes: list | None, elem: int | None, start: int, end: int, tid: int | None, role: str, name: str
    ) -> None:
        """Claim, for each recorded shape, the latest allocation alive at the call of its bytes
        (at ``elem`` bytes an element; where no element type is recorded, as c10d's TensorList
        arguments record none, at any element size: the latest fit wins)."""
        if not shapes or role not in self._roles:
            return
        for shape in shapes:
            if not is_shape(shape) or not shape:
                continue
            numel = math.prod(shape)
            fresh = role == "output"
            fits = [r for size in ((elem,) if elem else _ELEMENT_SIZES)
                    if (r := self._latest_alive(numel * size, start, tid, fresh)) is not None]  # fmt: skip
            if fresh and _is_receive(name):  # nothing may compute on the thread before the receive fills it
                fits = [r for r in fits if self._untouched(r, start, tid)]
            if fits:
                self._claim(max(fits, key=lambda r: self._alloc[r]), Handed(role, name, start, end, tid))

    def _claim(self, row: int, handed: Handed) -> None:
        if handed.role in self._roles and row not in self.by_row:
            self.by_row[row] = handed
            bisect.insort(self._claimed_calls, handed.call_ns)

    # ---- finding allocations ---------------------------------------------------------------
    def _latest_alive(self, nbytes: int, start: int, tid: int | None, fresh: bool = False) -> int | None:
        """The latest allocation on ``tid`` alive at ``start`` that fits ``nbytes``: for a buffer
        the call fills (``fresh``), among the buffers made to be filled that no other call claimed;
        for one it reads, any but the call's own buffers, whatever another call did with it (a ring
        sends the block the previous receive filled: that block is the send's input, and stays the
        receive's)."""
        claimed = self.by_row
        for row in self._sizes.latest_alive(nbytes, nbytes + self._slack, start):
            if tid is not None and self._tid[row] != tid:
                continue
            if fresh and row not in claimed and self._made_to_fill(row):
                return row
            if not fresh and (row not in claimed or claimed[row].call_ns != start):
                return row
        return None

    def _untouched(self, row: int, start: int, tid: int | None) -> bool:
        """Did nothing but bare allocators and communication run on ``tid`` between ledger row
        ``row``'s allocation and ``start``? (A buffer an op may have computed into is not claimed
        for a receive: sptrace.detect.producers' rule for the buffer a receive fills.)"""
        if self._ops is None:
            return True
        for j in self._ops.inside(int(self._alloc[row]), start, tid):
            name = self._ops.name(int(j))
            if name not in FACTORIES and not name.startswith(CALLS) and not name.startswith(("gloo:", "nccl:")):
                return False
        return True

    def _made_to_fill(self, row: int) -> bool:
        """Was ledger row ``row`` a buffer made to be filled (provenance.made_to_fill)? (True where
        the trace has no ops to tell.)"""
        if self._ops is None:
            return True
        tid = None if np.isnan(self._tid[row]) else int(self._tid[row])
        return made_to_fill(self._ops, int(self._alloc[row]), tid)

    def _pieces(self, nbytes: int, start: int, tid: int | None) -> list[int]:
        """A list all-gather's output pieces: the allocations of one piece's bytes alive at the
        call, made since the previous call on the thread (``[torch.empty_like(x) for _ in
        range(P)]`` runs right before the call)."""
        since = self._since(start)
        rows = []
        for row in self._sizes.latest_alive(nbytes, nbytes + self._slack, start):
            if self._alloc[row] < since:
                break
            if (tid is None or self._tid[row] == tid) and row not in self.by_row and self._made_to_fill(row):
                rows.append(row)
        return sorted(rows)

    def _since(self, start: int) -> int:
        """When the latest claimed call before ``start`` began (0: none)."""
        k = bisect.bisect_left(self._claimed_calls, start)
        return self._claimed_calls[k - 1] if k else 0

    def _made_inside(self, start: int, end: int, tid: int | None) -> list[int]:
        order = self._by_alloc
        times = self._alloc_sorted
        rows = order[int(np.searchsorted(times, start, side="left")) : int(np.searchsorted(times, end, side="right"))]
        free = self._free[rows]
        keep = np.isnan(free) | (free > end)
        if tid is not None:
            keep &= self._tid[rows] == tid
        return sorted(int(r) for r in rows[keep])

    def _element_size_of(self, name: str, event: EventRow) -> int | None:
        for t in load_list(event.get("input_types")):
            size = dtypes.element_size(t)
            if size:
                return size
        coll = event.get("coll_dtype")
        if coll is not None and not (isinstance(coll, float) and math.isnan(coll)):
            size = dtypes.element_size(str(coll))
            if size:
                return size
        return self._element_size

    @staticmethod
    def _recorded_elements(event: EventRow) -> list | None:
        """record_param_comms alone (no c10d op around it): its element counts, as one-dim shapes."""
        out = []
        for key in ("in_nelems", "out_nelems"):
            n = event.get(key)
            if n is not None and not pd.isna(n) and int(n) > 0:
                out.append([int(n)])
        return out or None


def _is_receive(name: str) -> bool:
    form = forms.form_of(name)
    return form is not None and form.kind == "recv"


def _outermost_calls(collectives: Intervals) -> list[int]:
    """The collective calls of the rank's own threads, outermost only (a c10d op records
    record_param_comms inside it, a functional collective its c10d op)."""
    calls = [i for i in range(len(collectives)) if collectives.name(i).startswith(CALLS)]
    outer = []
    for i in calls:
        around = collectives.enclosing(int(collectives.start[i]), int(collectives.end[i]), int(collectives.tid[i]))
        if not any(int(j) != i and collectives.name(int(j)).startswith(CALLS) for j in around):
            outer.append(i)
    return outer
