"""The collective that produced an allocation, read from what the allocation's thread did around
it: inside a collective, inside an op that gathered just before, the output buffer the next
collective fills, or the buffer the next receive fills. Kineto records no tensor's address in an
op, so each is told by thread, time and bytes (sptrace.detect.allocations asks; its origins,
sptrace.detect.provenance, start from the answer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sptrace.detect import forms
from sptrace.detect.args import load_list
from sptrace.detect.intervals import EventRow, Intervals
from sptrace.detect.provenance import FACTORIES, made_to_fill
from sptrace.detect.shapes import candidate_shapes
from sptrace.vocab import dtypes

if TYPE_CHECKING:
    from sptrace.detect.ledger import Allocation


def producing_collective(
    collectives: Intervals, ops: Intervals, alloc: Allocation, slack: int, element_size: int | None = None
) -> str | None:
    """The collective that produced an allocation, when the trace shows one:
    * it was allocated inside a collective (a functional all-gather's output);
    * it was allocated by a join or copy (``JOINS``) inside an op that ran an all-gather just
      before (DTensor's Redistribute: gather, then cat the chunks into the full tensor); what a
      matmul or an add computed inside such an op (Megatron-Core's linear, which gathers its
      input first) is a product, whose origin is its inputs';
    * it is the output the next collective on its thread fills (``out = torch.empty(...);
      all_gather_into_tensor(out, x)``: a buffer a bare allocator made, and that collective's
      recorded output has these bytes);
    * it is the buffer the next receive on its thread fills (``_received_into``; its element
      size: the receive's recorded dtype, else ``element_size``, the declared activation's)."""
    tid = int(alloc.tid) if alloc.tid is not None and not pd.isna(alloc.tid) else None
    ts = int(alloc.alloc_ns)
    i = collectives.innermost(ts, ts, tid)
    if i is not None:
        return collectives.name(i)
    chain = ops.enclosing(ts, ts, tid)
    made = next((int(j) for j in chain[::-1] if ops.name(int(j)) not in FACTORIES), None)
    if len(chain) >= 2 and made is not None and ops.name(made) in JOINS:  # the allocating op's caller
        parent = int(chain[-2])
        inner = collectives.inside(int(ops.start[parent]), ts, tid)
        gathers = [collectives.name(int(j)) for j in inner]
        gathers = [g for g in gathers if "gather" in g.lower()]
        if gathers:
            return f"{ops.name(parent)} ({gathers[-1]})"
    if not len(collectives) or not made_to_fill(ops, ts, tid):
        return None  # (what an op computed is no buffer a later collective fills, whatever its bytes)
    mask = collectives.start > ts
    if tid is not None:
        mask &= collectives.tid == tid
    after = np.flatnonzero(mask)
    if not len(after):
        return None
    first = collectives.row(int(after[np.argmin(collectives.start[after])]))
    name = str(first["name"])
    outputs = forms.output_shapes(name, first) if getattr(forms.form_of(name), "layout", None) in _OUT_FIRST else None
    elem_types = [t for t in load_list(first.get("input_types")) if dtypes.element_size(t)]
    elem = dtypes.element_size(elem_types[0]) if elem_types else None
    nbytes = int(alloc.bytes)
    if outputs and elem is not None and any(0 <= nbytes - int(np.prod(s)) * elem <= slack for s in outputs):
        return name
    return _received_into(collectives, ops, after, ts, tid, nbytes, slack, element_size)


def _received_into(
    collectives: Intervals, ops: Intervals, after: np.ndarray, ts: int, tid: int | None, nbytes: int, slack: int,
    element_size: int | None,
) -> str | None:  # fmt: skip
    """The receive that fills a buffer made for it (``buf = torch.empty(...); recv(buf, peer)``,
    ring attention's next K/V block). A Kineto trace records no receive's address, so the
    buffer is known by what its thread did: it was made by a bare allocator (a computed tensor is
    no receive's buffer), nothing but other bare allocations and point-to-point ops ran on its
    thread from then until a receive (a ring allocates its buffers, sends its own block, then
    receives the next), and that first receive records exactly its bytes at a known element size
    (the receive's dtype, else the declared activation's). A buffer that anything computed into
    before the receive is not claimed, whatever its size."""
    made = ops.innermost(ts, ts, tid)
    if made is None or ops.name(made) not in FACTORIES:
        return None
    recv = None
    for j in after[np.argsort(collectives.start[after], kind="stable")]:
        kind = _p2p_kind(collectives.name(int(j)), collectives.row(int(j)))
        if kind == "recv":
            recv = int(j)
            break
        if kind != "send":
            return None  # another collective first: not a receive's buffer
    if recv is None:
        return None
    lo, hi = int(ops.end[made]), int(collectives.start[recv])
    exchange = [int(j) for j in collectives.inside(lo, hi, tid)]
    for k in ops.inside(lo, hi, tid):
        k = int(k)
        name = ops.name(k)
        nested = any(collectives.start[j] <= ops.start[k] and ops.end[k] <= collectives.end[j] for j in exchange)
        if name not in FACTORIES and not nested and _p2p_kind(name, ops.row(k)) is None:
            return None  # computed on: the buffer may be that op's output, not the receive's
    row = collectives.row(recv)
    name = str(row["name"])
    elems, size = _recorded_elements(name, row)
    # c10d's recv_ records a TensorList, with no element type: the factory that made the buffer
    # records its own (aten::empty's dtype argument), else the declared activation's
    size = size or _factory_element_size(ops.row(made)) or element_size
    fits = elems is not None and size is not None and 0 <= nbytes - elems * size <= slack
    return name if fits else None


def _factory_element_size(op: EventRow) -> int | None:
    """The element size a factory op recorded for what it made (its dtype argument), if any."""
    kinds = {dtypes.element_size(dtype) for _, dtype in candidate_shapes(op) if dtype is not None}
    return kinds.pop() if len(kinds) == 1 else None


def _p2p_kind(name: str, row: EventRow) -> str | None:
    """'send' or 'recv' for a point-to-point op (c10d's, NCCL's and gloo's names, or
    record_param_comms naming one), else None."""
    form = forms.form_of(name)
    if form is not None:
        return form.kind if form.kind in ("send", "recv") else None
    what = str(row.get("coll_name") or "") if name == "record_param_comms" else name.rpartition(":")[2]
    what = what.lower()
    return what if what in ("send", "recv") else None


def _recorded_elements(name: str, row: EventRow) -> tuple[int | None, int | None]:
    """(elements, element size) of the tensor a point-to-point op moved, where the trace records
    them (None where it does not)."""
    if name in forms.all_forms():
        sizes = forms.sizes_from_op(name, row)
        elems, dtype = sizes.in_elems, sizes.dtype
    else:
        elems, dtype = row.get("in_nelems"), row.get("coll_dtype")
    size = dtypes.element_size(str(dtype)) if dtype is not None and not pd.isna(dtype) else None
    return (None if elems is None or pd.isna(elems) else int(elems)), size


JOINS = frozenset({
    "aten::cat", "aten::_cat", "aten::stack", "aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy",
    "aten::to", "aten::reshape", "aten::_unsafe_view", "aten::_reshape_alias", "aten::index_select",
    "aten::movedim", "aten::permute", "aten::transpose",
})  # fmt: skip
"""Ops that join or copy what they are given (the pieces a gather returned) without computing."""

_OUT_FIRST = ("out_in", "out_in_lists")
"""c10d forms whose first recorded argument is an output the caller allocated."""
