"""Where an allocation came from: the collective or the matmul that made it, followed back through
the elementwise ops, copies, casts and concatenations between them.

A Kineto trace names no tensor: ops record their inputs' shapes and types, [memory] events the
address, size and thread of each allocation. Data flow is read from those alone:

* the op that made an allocation is the innermost op around it that is not a bare allocator
  (``aten::empty``, ``empty_like``, ``empty_strided``...: those only run inside their caller);
* an allocation inside a collective, or the output buffer the next collective on its thread
  fills, was made by that collective (``allocations._producer``); one inside an op that ran a
  gather just before (DTensor's redistribute) was gathered;
* an op's input is the latest allocation, on the same thread and inside the same forward, of
  exactly that input's bytes that was made before the op started (an input is always made before
  its consumer; a view allocates nothing, so a view's source is the storage it views when its
  bytes match). A concatenation right after a list all-gather whose outputs add up to its own
  bytes joins the gathered pieces;
* a matmul's output is a column-parallel product when it contracts the hidden size H (its weight
  is [N, H]: this rank's N columns), a row-parallel one when it produces H from a narrower input
  (the partial sums a reduce-scatter then shards), and an attention product when both operands
  are activations. When the weight is square (N == H, e.g. F/P == H) the input's own origin
  decides: a gathered input makes a column product, a column product's descendant a row one.

Hand-written because no library reads data flow from a profiler trace (HTA reads kernels and
collectives, not tensors; torch's memory profiler needs the live profiler session, which a user's
exported trace does not carry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sptrace.detect.alive import AliveBySize
from sptrace.detect.args import is_shape, load_list
from sptrace.detect.intervals import EventRow, Intervals

if TYPE_CHECKING:
    from sptrace.detect.handed import HandedTensors
    from sptrace.detect.pack_copies import PackCopies, PackCopy
from sptrace.vocab import dtypes

FACTORIES = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::ones", "aten::ones_like", "aten::full",
    "aten::full_like", "aten::new_full", "aten::resize_", "aten::zero_", "aten::fill_",
})  # fmt: skip


def made_to_fill(ops: Intervals, alloc_ns: int, tid: int | None) -> bool:
    """Was an allocation at ``alloc_ns`` on ``tid`` made by a bare allocator (``torch.empty``,
    ``new_empty``, ``zeros``...) outside any computing aten op: a buffer made for something to
    fill, not an op's result?"""
    chain = [ops.name(int(i)) for i in ops.enclosing(alloc_ns, alloc_ns, tid)]
    if not chain or chain[-1] not in FACTORIES:
        return False
    maker = next((name for name in reversed(chain) if name not in FACTORIES), None)
    return maker is None or not maker.startswith("aten::")


MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})
_DEPTH = 8


@dataclass(frozen=True)
class Origin:
    """What made a tensor: ``kind`` is one of gathered (an all-gather's buffer, or pieces other
    ranks sent joined), reduced (summed in place over a group by an all-reduce), all-to-all,
    reduce-scattered, received (a block one peer sent: a point-to-point receive filled it),
    column, row, attention (None when the trace does not tell); ``text`` says how it was read."""

    kind: str | None
    text: str = ""


UNKNOWN = Origin(None)


_COPIES = frozenset({"aten::clone", "aten::contiguous", "aten::reshape", "aten::_unsafe_view", "aten::_reshape_alias"})


def _sends_pieces(name: str) -> bool:
    """Does this collective fill a buffer with a piece another rank holds whole (a broadcast, a
    receive, a gather's piece)? An all-to-all's or a reduce-scatter's output is a shard of a
    differently split tensor, never one rank's piece of the sequence."""
    return "broadcast" in name.lower() or collective_kind(name) in ("gathered", "received")


def collective_kind(name: str) -> str | None:
    low = name.lower()
    if "gather" in low:
        return "gathered"
    if "all_to_all" in low or "alltoall" in low:
        return "all-to-all"
    if "reduce_scatter" in low or "reducescatter" in low:
        return "reduce-scattered"
    if "recv" in low:
        return "received"
    return None


class Provenance:
    """Origins of one rank's allocations (rows of ``ledger``), cached per row."""

    def __init__(
        self, ledger: pd.DataFrame, ops: Intervals, collectives: Intervals, hidden: int,
        handed: HandedTensors | None = None, copies: PackCopies | None = None,
    ) -> None:  # fmt: skip
        self.ledger = ledger
        self.copies = copies
        """Pack hooks' copies of saved tensors (sptrace.detect.pack_copies): a copy's origin is
        its source's."""
        self.ops = ops
        self.collectives = collectives
        self.hidden = hidden
        self.handed = handed
        """The buffers collective calls filled or returned (sptrace.detect.handed): a buffer made
        by ``torch.empty`` before the call that fills it has that call's origin."""
        self._alloc = ledger["alloc_ns"].to_numpy(dtype=np.int64)
        self._bytes = ledger["bytes"].to_numpy(dtype=np.int64)
        self._tid = ledger["tid"].to_numpy(dtype=np.float64, na_value=np.nan)
        self._free = ledger["free_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
        self._cache: dict[int, Origin] = {}
        self._copy_cache: dict[int, tuple[PackCopy | None, int | None]] = {}

    # ---- the op that made an allocation --------------------------------------------------------
    def maker(self, alloc_ns: int, tid: int | None) -> int | None:
        """The innermost enclosing op that is not a bare allocator."""
        chain = self.ops.enclosing(alloc_ns, alloc_ns, tid)
        for i in chain[::-1]:
            if self.ops.name(int(i)) not in FACTORIES:
                return int(i)
        return None

    def source(self, before_ns: int, nbytes: int, tid: int | None, since_ns: int) -> int | None:
        """The ledger row of the latest allocation of exactly ``nbytes`` made on ``tid`` in
        [since_ns, before_ns)."""
        return self._latest(nbytes, nbytes, before_ns, tid, since_ns)

    @cached_property
    def _sizes(self) -> AliveBySize:
        return AliveBySize(self._alloc, self._free, self._bytes)

    def _latest(self, low: int, high: int, before_ns: int, tid: int | None, since_ns: int) -> int | None:
        """The ledger row of the latest allocation of ``low`` to ``high`` bytes made on ``tid`` in
        [since_ns, before_ns) (of several made at that time, the first row)."""
        found: int | None = None
        for row in self._sizes.latest_made(low, high, before_ns):
            made = self._alloc[row]
            if made < since_ns or (found is not None and made != self._alloc[found]):
                break
            if tid is None or self._tid[row] == tid:
                found = row
        return found

    # ---- origins -----------------------------------------------------------------------------
    def of_row(self, row: int, producer: str | None, since_ns: int, depth: int = 0) -> Origin:
        """The origin of ledger row ``row`` (``producer``: the collective that made it, if known)."""
        if producer:
            kind = collective_kind(producer)
            if kind:
                return Origin(kind, f"made by {producer}")
        call = self.handed.of(row) if self.handed is not None else None
        if call is not None and call.role in ("output", "returned") and collective_kind(call.collective):
            return Origin(collective_kind(call.collective), f"the buffer {call.collective} filled")
        if call is not None and call.role == "summed":
            return Origin("reduced", f"summed in place over its group by {call.collective}")
        key = row
        if depth == 0 and key in self._cache:
            return self._cache[key]
        tid = self._tid_of(row)
        copy, source = self.copy_source(row, since_ns)
        if copy is not None:
            inner = UNKNOWN if source is None or depth >= _DEPTH else self.of_row(
                source, self._producer_of(source), since_ns, depth + 1)  # fmt: skip
            out = Origin(inner.kind, f"{copy.describe()} of a tensor {inner.text}") if inner.kind else UNKNOWN
        else:
            i = self.maker(int(self._alloc[row]), tid)
            out = UNKNOWN if i is None else self._of_op(i, int(self._bytes[row]), tid, since_ns, depth)
        if depth == 0:
            self._cache[key] = out
        return out

    def copy_source(self, row: int, since_ns: int) -> tuple[PackCopy | None, int | None]:
        """The pack-hook copy ledger row ``row`` is (None if it is none), and the row of the tensor
        it copies (None where that was made before ``since_ns``: a weight, a persistent buffer)."""
        if row in self._copy_cache:
            return self._copy_cache[row]
        self._copy_cache[row] = found = self._copy_source(row, since_ns)
        return found

    def _copy_source(self, row: int, since_ns: int) -> tuple[PackCopy | None, int | None]:
        copy = self.copies.of(int(self._alloc[row]), self._tid_of(row)) if self.copies is not None else None
        if copy is None:
            return None, None
        tid, numel = self._tid_of(row), math.prod(copy.shape)
        own = int(self._bytes[row]) // numel if numel and int(self._bytes[row]) % numel == 0 else None
        sizes = [dtypes.element_size(copy.source_dtype)] if copy.source_dtype else [own, 4, 2, 8, 1]
        for size in dict.fromkeys(z for z in sizes if z):
            nbytes = numel * size
            if copy.an_input:  # an op saves its inputs: the latest of those bytes made before it
                found = self.source(copy.saver_start_ns, nbytes, tid, since_ns)
            else:  # else its output, made inside it before the hook ran
                found = self._latest(nbytes, nbytes, int(self._alloc[row]), tid, copy.saver_start_ns)
            if found is not None and found != row:
                return copy, found
        return copy, None

    def _of_op(self, i: int, nbytes: int, tid: int | None, since_ns: int, depth: int) -> Origin:
        ops = self.ops
        name = ops.name(i)
        kind = collective_kind(name) if name.startswith(("c10d", "_c10d", "record_param_comms")) else None
        if kind:
            return Origin(kind, f"made by {name}")
        row = ops.row(i)
        dims = load_list(row.get("input_dims"))
        types = load_list(row.get("input_types"))
        start = int(ops.start[i])
        if name in MATMULS:
            return self._matmul(name, dims, types, start, tid, since_ns, depth)
        if depth >= _DEPTH:
            return UNKNOWN
        if name in ("aten::cat", "aten::stack", "aten::_cat"):
            gathered = self._gathered_pieces(row, start, tid)
            if gathered:
                return Origin("gathered", f"joins the pieces {gathered} gathered")
            received = self._received_pieces(row, start, tid)
            if received:
                return Origin("gathered", f"joins the pieces {received}")
        # elementwise ops, norms, copies and casts: the origin of the first tensor input
        shapes = [d for d in dims if is_shape(d)]
        if not shapes:
            return UNKNOWN
        elem = next((dtypes.element_size(t) for t in types if dtypes.element_size(t)), None)
        if elem is None:
            return UNKNOWN
        src = self.source(start, math.prod(shapes[0]) * elem, tid, since_ns)
        # a view (q of a fused qkv): the storage its strides reach into. Where an allocation of
        # exactly the view's bytes exists too (q of a/P heads has a gathered [B, S, H]'s bytes when
        # a*d/P == H), the later of the two is the copy's input: a view is taken of what was made last
        viewed = self._viewed(name, math.prod(shapes[0]), elem, start, tid, since_ns)
        if viewed is not None and (src is None or self._alloc[viewed] > self._alloc[src]):
            src = viewed
        if src is None:
            return UNKNOWN
        inner = self.of_row(src, self._producer_of(src), since_ns, depth + 1)
        if inner.kind is None:
            return UNKNOWN
        return Origin(inner.kind, inner.text if name in ("aten::clone", "aten::contiguous", "aten::copy_")
                      else f"{name} of a tensor {inner.text}")  # fmt: skip

    def _viewed(self, name: str, numel: int, elem: int, start: int, tid: int | None, since: int) -> int | None:
        """A copy that materializes a view (q of a fused qkv, a transposed context): the latest
        allocation larger than the view but at most 4x its bytes (a fused projection's output holds
        3 views of one size). Kineto keeps the view's shape, not its storage (nor its strides)."""
        if name not in _COPIES:
            return None
        nbytes = numel * elem
        return self._latest(nbytes + 1, 4 * nbytes, start, tid, since)

    def _tid_of(self, row: int) -> int | None:
        tid = self._tid[row]
        return None if np.isnan(tid) else int(tid)

    def _producer_of(self, row: int) -> str | None:
        tid = self._tid_of(row)
        i = self.collectives.innermost(int(self._alloc[row]), int(self._alloc[row]), tid)
        return None if i is None else self.collectives.name(i)

    def _gathered_pieces(self, op: EventRow, start: int, tid: int | None) -> str | None:
        """A concatenation of the pieces a list all-gather just returned: the gather that ended
        last before ``start`` on ``tid`` took one tensor of the shape every piece has (c10d
        records a list gather's input, not its output list)."""
        c = self.collectives
        pieces = load_list(op.get("input_dims"))
        pieces = pieces[0] if pieces and isinstance(pieces[0], list) and all(is_shape(p) for p in pieces[0]) else []
        if len(pieces) < 2 or any(p != pieces[0] for p in pieces) or not len(c):
            return None
        mask = c.end <= start
        if tid is not None:
            mask &= c.tid == tid
        before = np.flatnonzero(mask)
        if not len(before):
            return None
        j = int(before[np.argmax(c.end[before])])
        name = c.name(j)
        if collective_kind(name) != "gathered":
            return None
        shapes = [d for arg in load_list(c.row(j).get("input_dims")) for d in ([arg] if is_shape(arg) else arg or [])
                  if is_shape(d)]  # fmt: skip
        return f"by {name}" if shapes and list(shapes[0]) == list(pieces[0]) else None

    def _received_pieces(self, op: EventRow, start: int, tid: int | None) -> str | None:
        """A concatenation of pieces that other ranks sent: of its pieces (one tensor list of equal
        shapes), most are buffers collective calls filled (broadcasts, receives, a ring's next
        block), the rest this rank's own. The sequence assembled by anything but a gather."""
        if self.handed is None:
            return None
        args = load_list(op.get("input_dims"))
        pieces = args[0] if args and isinstance(args[0], list) and all(is_shape(p) for p in args[0]) else []
        if len(pieces) < 2:
            return None
        types = load_list(op.get("input_types"))
        sizes = [dtypes.element_size(t) for t in types if dtypes.element_size(t)] or [4, 2, 8, 1]
        filled: dict[str, int] = {}
        for shape in {tuple(p) for p in pieces}:
            want = sum(1 for p in pieces if tuple(p) == shape)
            best: dict[str, int] = {}
            for size in sizes:  # (a TensorList records no element type: each size is tried, the best kept)
                found: dict[str, int] = {}
                for r in self._alive_of(math.prod(shape) * size, start, tid)[-want:]:
                    call = self.handed.of(r)
                    if call is not None and call.role in ("output", "returned") and _sends_pieces(call.collective):
                        found[call.collective] = found.get(call.collective, 0) + 1
                if sum(found.values()) > sum(best.values()):
                    best = found
            for name, n in best.items():
                filled[name] = filled.get(name, 0) + n
        if 2 * sum(filled.values()) < len(pieces) or not filled:
            return None
        return f"{', '.join(sorted(filled))} filled ({sum(filled.values())} of {len(pieces)})"

    def _alive_of(self, nbytes: int, before_ns: int, tid: int | None) -> list[int]:
        """Ledger rows of ``nbytes`` made on ``tid`` before ``before_ns`` and alive then, oldest first."""
        rows = [r for r in self._sizes.latest_alive(nbytes, nbytes, before_ns) if tid is None or self._tid[r] == tid]
        return rows[::-1]

    def _matmul(
        self, name: str, dims: list[object], types: list[object], start: int, tid: int | None, since_ns: int, depth: int
    ) -> Origin:
        mats = [tuple(d) for d in dims if is_shape(d) and len(d) >= 1]
        if name in ("aten::addmm", "aten::baddbmm") and len(mats) >= 3:
            mats = mats[-2:]
        if len(mats) < 2:
            return UNKNOWN
        a, b = mats[0], mats[1]
        if (len(a) >= 3 and len(b) >= 3) or (name in ("aten::bmm", "aten::baddbmm")):
            return Origin("attention", f"an activation x activation product ({name})")
        if len(b) != 2:
            return UNKNOWN
        k, n = (b[1], b[0]) if name == "aten::linear" else (b[0], b[1])
        H = self.hidden
        if k == H and n != H:
            return Origin("column", f"a column-parallel product ({name} with a [{k}, {n}] weight)")
        if n == H and k != H:
            return Origin("row", f"a row-parallel product ({name} with a [{k}, {n}] weight)")
        if k == n == H and depth < _DEPTH:  # a square weight: the input's origin decides
            elem = next((dtypes.element_size(t) for t in types if dtypes.element_size(t)), None)
            src = self.source(start, math.prod(a) * elem, tid, since_ns) if elem else None
            inner = self.of_row(src, self._producer_of(src), since_ns, depth + 1) if src is not None else UNKNOWN
            if inner.kind in ("gathered", "reduced"):
                return Origin("column", f"a column-parallel product ({name}, square weight, of a {inner.kind} input)")
            if inner.kind in ("column", "attention"):
                return Origin("row", f"a row-parallel product ({name}, square weight, of a {inner.kind} product)")
        return UNKNOWN
