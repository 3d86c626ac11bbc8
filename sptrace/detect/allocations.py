"""Allocations from ``[memory]`` events, and what a step keeps alive across its forward ->
backward boundary.

The allocation ledger (every allocation with its free) is sptrace.detect.ledger's.

Retained = allocated in a forward's window and alive when the backward that consumes it starts,
at every such boundary of the trace (each step and micro-batch: sptrace.detect.boundaries),
whoever holds it:
  * the sptrace.saved records: tensors autograd saved (exact module, shape, dtype, storage);
  * every other allocation of the forward window still alive at the boundary, from memory events.
Each gets a holder from evidence (sptrace.detect.holders: autograd, the model, the backend, a
parameter, or undecided) and says it in words; only what autograd or the model keeps can break
the contract. The backend can hold only the exact tensors of a collective call
(sptrace.detect.handed): gloo and NCCL drop their reference on threads the profiler does not
record, which is why such a tensor's free can be missing from a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
import pandas as pd

from sptrace.detect.boundaries import Boundary, find_boundaries
from sptrace.detect.call_fates import call_fates
from sptrace.detect.columns import empty_frame, has_prefix, is_one_of, take_columns
from sptrace.detect.forward_facts import forward_weight_widths, layers_seen, shapes_seen
from sptrace.detect.handed import Handed, HandedTensors
from sptrace.detect.holders import BACKEND_THREADS, KEEPERS, SAVED_RECORD, Holder, HolderRules
from sptrace.detect.index import RankIndex
from sptrace.detect.intervals import Intervals, within
from sptrace.detect.kinds import AUTOGRAD_NODE
from sptrace.detect.ledger import AddressIndex, Allocation, detect_ledger, unrecorded_allocator_activity
from sptrace.detect.library_joins import LibraryJoins
from sptrace.detect.pack_copies import PackCopies, PackCopy
from sptrace.detect.producers import producing_collective
from sptrace.detect.provenance import Origin, Provenance
from sptrace.detect.released_census import census_of_boundaries
from sptrace.detect.shapes import infer_shape
from sptrace.detect.source_frames import SOURCE_COLUMNS, MakerLines, source_cells
from sptrace.detect.windows import containing, latest_containing
from sptrace.load.trace import RankTrace
from sptrace.vocab import markers

RETAINED_COLUMNS = [
    "rank", "module", "layer", "shape", "dtype", "nbytes", "storage_bytes", "storage_ptr", "source", "alloc_op",
    "producer", "saved_by", "holder", "evidence", "alloc_ns", "free_ns", "freed_in", "kind", "step", "micro_batch",
    "boundary", "origin", "origin_text", "collective", "call_key", *SOURCE_COLUMNS,
]  # fmt: skip


class _Where(TypedDict):
    """The forward/backward boundary a retained tensor is kept across (RETAINED_COLUMNS)."""

    step: int
    micro_batch: int
    boundary: str | None


class RetainedRow(TypedDict, total=False):
    """A row of ``Retention.tensors`` (RETAINED_COLUMNS) as it is built (``_retained_from_memory``
    gives all but the rank, boundary, origin and call key, which its caller adds)."""

    rank: int | None
    module: str | None
    layer: int | None
    shape: tuple[int, ...] | list[int] | None
    dtype: str | None
    nbytes: int
    storage_bytes: int
    storage_ptr: int | None
    source: str
    alloc_op: str | None
    producer: str | None
    saved_by: str | None
    holder: str
    """Who holds it (sptrace.detect.holders.HOLDERS)."""
    evidence: str
    """Why: the evidence for its holder, in words a user can check."""
    alloc_ns: int | None
    free_ns: float | None
    freed_in: str | None
    kind: str
    step: int
    micro_batch: int
    boundary: str | None
    origin: str | None
    origin_text: str | None
    collective: str | None
    """The collective call it was one of the exact tensors of (sptrace.detect.handed), if any."""
    call_key: str | None
    made_file: str | None  # where it was made (sptrace.detect.source_frames.SOURCE_COLUMNS)
    made_line: int | None
    made_function: str | None
    made_exact: bool | None
    """That call's place in its forward (sptrace.detect.call_fates), the same on every rank."""


CUDA_SLACK = 2**20
"""The CUDA caching allocator's block can exceed the request by up to ~1 MiB."""
_COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional", "record_param_comms", "nccl:", "gloo:", "symm_mem::")


def backward_start_ns(trace: RankTrace) -> int | None:
    """When backward starts: the sptrace.phase marker, else the first autograd node."""
    ev = trace.events
    phase = ev[is_one_of(ev["name"], [markers.phase_name("backward")])]
    if len(phase):
        return int(phase["ts_ns"].min())
    nodes = ev[has_prefix(ev["name"], AUTOGRAD_NODE)]
    return int(nodes["ts_ns"].min()) if len(nodes) else None


def forward_start_ns(trace: RankTrace) -> int:
    ev = trace.events
    for marker in (markers.phase_name("forward"), "ProfilerStep#"):
        hit = ev[has_prefix(ev["name"], marker)]
        if len(hit):
            return int(hit["ts_ns"].min())
    return int(ev["ts_ns"].min())


@dataclass
class Retention:
    """What one rank kept alive across its forward -> backward boundary."""

    rank: int
    tensors: pd.DataFrame
    """One row per retained storage (RETAINED_COLUMNS)."""
    boundary_ns: int | None
    """The first backward's start; None when the profiled window has no backward."""
    has_records: bool
    has_memory: bool
    has_census: bool = False
    has_stacks: bool = False  # it shows source lines: Python stacks, or sptrace.instrument's records
    """sptrace.instrument's census of Python-held storages is in the trace (at some boundary)."""
    layers_seen: set[int] = field(default_factory=set)
    """Layers the trace shows running (markers, python stacks, attributed tensors)."""
    shapes_seen: set[tuple[int, ...]] = field(default_factory=set)
    """Every tensor shape the forward's ops took as input, and every retained tensor's shape:
    a declared B, S, H that none of them has is a wrong declaration."""
    notes: list[str] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    """Every forward -> backward boundary judged (each step, each micro-batch)."""
    shape_dtypes: dict[tuple[int, ...], set[str]] = field(default_factory=dict)
    """The element types each input shape of the forwards' ops was taken with: the activation
    dtype, read where the user did not declare it."""
    weight_widths: dict[int, str] = field(default_factory=dict)
    """The widths the forwards' weights give their products and inputs (sptrace.detect.weights)."""
    call_fates: pd.DataFrame | None = None
    """What became of the tensors each forward's collective calls had (sptrace.detect.call_fates)."""


def detect_retained(
    trace: RankTrace, *, element_size: int | None = None, index: RankIndex | None = None, hidden: int | None = None
) -> Retention:
    """Everything this rank kept alive from each forward into the backward that consumes it, at
    every boundary of the trace (each step, each micro-batch: sptrace.detect.boundaries).

    ``element_size``: the declared activation element size, used only when an allocating op
    records no element type of its own; ``hidden``: the declared H, which tells a column-parallel
    matmul (it contracts H) from a row-parallel one (it produces H) in each tensor's origin."""
    idx = index or RankIndex(trace)
    ledger = detect_ledger(trace)
    ev = trace.events
    first = ev["ts_ns"].min()  # (missing times skipped)
    bounds = find_boundaries(idx, int(first) if pd.notna(first) else 0)
    nodes = idx.backward_nodes
    # (tests on the distinct names, not on every row turned into a Python string: see Distinct)
    records = take_columns(ev, idx.by_name.prefix(markers.SAVED), ["name", "ts_ns", "tid"])
    censuses = take_columns(ev, idx.by_name.prefix(markers.RELEASED), ["name", "ts_ns"])
    is_op = idx.by_cat.one_of(["cpu_op"]) & idx.is_x
    cpu = take_columns(ev, is_op, ["ts_ns", "input_dims", "input_types"])  # what shapes_seen reads
    ops = Intervals.of(idx.table, is_op & ~idx.by_name.prefix(markers.PREFIX))
    collectives = Intervals.of(idx.table, is_op & idx.by_name.prefix(_COLLECTIVE_PREFIXES))
    cuda = bool((ledger["device_type"] == 1).any())
    slack = CUDA_SLACK if cuda else 0
    handed = HandedTensors(ledger, collectives, element_size, slack, ops) if not ledger.empty else None
    origins = Provenance(ledger, ops, collectives, hidden, handed, PackCopies(idx.python, ops))
    makers = MakerLines(idx)
    at_address = AddressIndex(ledger)
    backend_rows = idx.is_x & idx.by_name.prefix(BACKEND_THREADS)
    backend_ranges = Intervals.of(idx.table, backend_rows)
    out = Retention(
        rank=int(trace.rank or 0), tensors=None,  # type: ignore[arg-type]  # set on every return
        boundary_ns=bounds[0].backward_ns if bounds else None, has_records=bool(len(records)),
        has_memory=not ledger.empty, boundaries=bounds,
    )  # fmt: skip
    out.layers_seen = layers_seen(idx)
    out.has_stacks = makers.has_stacks
    if not bounds:
        out.shapes_seen = shapes_seen(cpu, forward_start_ns(trace), None)
        out.tensors = empty_frame(RETAINED_COLUMNS)
        return out
    forwards = np.array([b.forward_ns for b in bounds], dtype=np.int64)
    backwards = np.array([b.backward_ns for b in bounds], dtype=np.int64)
    window_ends = np.array([b.window_end_ns for b in bounds], dtype=np.int64)
    out.shapes_seen |= shapes_seen(cpu, forwards, backwards, out.shape_dtypes)
    out.weight_widths = forward_weight_widths(ev, idx, is_op, forwards, backwards, hidden)
    many_steps = len({b.step for b in bounds}) > 1
    many_micro = any(b.micro_batch > 0 for b in bounds)

    def where(b: Boundary) -> _Where:
        return _Where(step=b.step, micro_batch=b.micro_batch, boundary=b.label(many_steps, many_micro) or None)

    last = ev["ts_ns"].max()
    rules = HolderRules(nodes, backend_ranges, unrecorded_allocator_activity(trace) if not ledger.empty else {},
                        int(last) if pd.notna(last) else 0, LibraryJoins(idx.python, ops))  # fmt: skip
    keys: dict[tuple[int, int], str] = {}  # (boundary, ledger row) -> the call's key
    if handed is not None:
        keys, out.call_fates = call_fates(handed, bounds, ledger, rules)
    rows: list[RetainedRow] = []
    covered: set[int] = set()
    seen_ptrs: set[tuple[int, int]] = set()
    saves = [
        (rec, int(ts), tid, name.count(markers.SAVED) == 1)
        for name, ts, tid in zip(map(str, records["name"]), records["ts_ns"], records["tid"])
        for rec in markers.SavedTensor.all_from_marker(name)
    ]  # one record per event, or a forward's records in one event (written when it returns)
    save_windows = latest_containing(np.array([ts for _, ts, _, _ in saves], dtype=np.int64), forwards, window_ends)
    for (rec, ts, tid, own_event), k in zip(saves, save_windows.tolist()):
        # weights are not activations; data without autograd history ("input") still costs memory
        if rec.kind == "param":
            continue
        if k < 0:
            continue  # a save after its boundary is recomputation in backward: not kept across it
        b = bounds[k]
        if rec.storage_ptr:
            if (k, rec.storage_ptr) in seen_ptrs:
                continue  # the same storage saved twice costs once
            seen_ptrs.add((k, rec.storage_ptr))
        found = at_address.allocation_at(rec.storage_ptr, ts) if rec.storage_ptr else None
        alloc = found[1] if found is not None else None
        if found is not None:
            covered.add(found[0])
        holder = SAVED_RECORD
        if out.has_memory and rec.storage_ptr and (alloc is None or alloc.alloc_ns < b.forward_ns):
            # its storage was not made by this forward: a weight, a view of one, a persistent buffer
            holder = Holder("parameter", "an sptrace.saved record of a storage allocated before this forward (a "
                                         "weight, a view of one, or a persistent buffer): not an activation of "
                                         "the step")  # fmt: skip
        made_by = _op_name(ops, int(alloc.alloc_ns), alloc.tid) if alloc is not None else None
        producer = producing_collective(collectives, ops, alloc, slack, element_size) if alloc is not None else None
        origin = origins.of_row(found[0], producer, b.forward_ns) if found is not None else None
        if rec.kind == "offloaded":  # a pack hook's copy: held in the saved tensor's place, made of what it copies
            made = int(alloc.alloc_ns) if alloc is not None else ts  # (its source was alive when it was made)
            holder, origin = _offloaded_record(rec, b, made, at_address, origins, out.has_memory)
        call = handed.of(found[0]) if handed is not None and found is not None else None
        saved_by = _op_name(ops, ts, tid) if own_event else None
        made_at = makers.of(rec.source_ptr if rec.kind == "offloaded" else rec.storage_ptr, alloc, b)
        rows.append({
            "rank": trace.rank, "module": rec.module, "layer": idx.layer_of(rec.module), "shape": rec.shape,
            "dtype": rec.dtype, "nbytes": rec.nbytes, "storage_bytes": rec.storage_nbytes or rec.nbytes,
            "storage_ptr": rec.storage_ptr or None, "source": "sptrace.saved record", "alloc_op": made_by,
            "producer": producer, "origin": origin and origin.kind, "origin_text": origin and origin.text,
            "saved_by": saved_by, "holder": holder.kind,
            "evidence": holder.evidence + (f" (saved by {saved_by})" if saved_by and holder is SAVED_RECORD else ""),
            "alloc_ns": None if alloc is None else alloc.alloc_ns,
            "free_ns": None if alloc is None else alloc.free_ns,
            "freed_in": None if alloc is None else rules.freed_in(alloc.free_ns), "kind": rec.kind,
            "collective": call.collective if call is not None else None,
            "call_key": None if found is None else keys.get((k, found[0])), **where(b), **source_cells(made_at),
        })  # fmt: skip
    if not ledger.empty:
        held = census_of_boundaries(bounds, censuses)
        out.has_census = bool(held)
        made, freed = at_address.alloc, at_address.free
        in_backward = within(idx.backward_nodes, made) | within(_backward_phases(idx), made)
        own = Intervals.of(idx.table, (is_op & idx.by_name.prefix(_COLLECTIVE_PREFIXES)) | backend_rows)
        made_rows, made_in = containing(made, forwards, window_ends)
        keep = ~in_backward[made_rows]
        made_rows, made_in = made_rows[keep], made_in[keep]
        kept = np.isnan(freed[made_rows]) | (freed[made_rows] >= backwards[made_in])  # alive at the boundary
        for row_number, k in zip(made_rows[kept].tolist(), made_in[kept].tolist()):
            b = bounds[k]
            if row_number in covered:
                continue
            rec = at_address.record(row_number)
            call = handed.of(row_number) if handed is not None else None
            row = _retained_from_memory(rec, b, idx, ops, collectives, own, rules, call, slack, element_size,
                                        held.get(b))  # fmt: skip
            if row is None:  # a backend's own buffer inside a c10d call or its worker's annotation
                continue
            copy, source = origins.copy_source(row_number, b.forward_ns)
            if copy is not None:
                row = _offloaded(row, copy, source)
            origin = origins.of_row(row_number, row["producer"], b.forward_ns)
            what = at_address.record(source) if copy is not None and source is not None else rec
            made_at = makers.of(int(what.addr), what, b)
            rows.append({"rank": trace.rank, **row, **where(b), "origin": origin.kind,
                         "origin_text": origin.text, "call_key": keys.get((k, row_number)),
                         **source_cells(made_at)})  # fmt: skip
    if out.has_records and not out.has_memory:
        out.notes.append(
            "no [memory] events: only tensors autograd saved through saved_tensors_hooks are seen (not those "
            "held by Python references, or kept by activation checkpointing); profile with profile_memory=True"
        )
    frame = pd.DataFrame(rows, columns=RETAINED_COLUMNS)
    out.tensors = frame
    out.layers_seen |= {int(x) for x in frame["layer"].dropna()}
    out.shapes_seen |= {tuple(s) for s in frame["shape"] if isinstance(s, (tuple, list))}
    return out


def _offloaded_record(
    rec: markers.SavedTensor, b: Boundary, ts: int, at_address: AddressIndex, origins: Provenance, memory: bool
) -> tuple[Holder, Origin | None]:
    """The holder and origin of a copy sptrace.instrument saw a pack hook keep (sptrace.offloading);
    ``ts``: when the copy was made (its source was alive then)."""
    found = at_address.allocation_at(rec.source_ptr, ts) if rec.source_ptr else None
    source = found[0] if found is not None else None
    if memory and (source is None or at_address.alloc[source] < b.forward_ns):
        return Holder("parameter", "an sptrace.saved record of a pack hook's copy of a tensor made before this "
                                   "forward (a weight, a persistent buffer)"), None  # fmt: skip
    origin = origins.of_row(source, None, b.forward_ns) if source is not None else None
    return Holder("offloaded", "an sptrace.saved record: a copy a saved-tensor pack hook kept for backward in the "
                               "place of the tensor autograd saved"), origin  # fmt: skip


def _offloaded(row: RetainedRow, copy: PackCopy, source: int | None) -> RetainedRow:
    """A pack hook's copy of a saved tensor: its source's dims, and, where the step keeps it,
    ``offloaded`` (kept for backward in the saved tensor's place); a copy of a tensor made before
    the forward (a weight) is a parameter's."""
    held = row["holder"] in KEEPERS
    kind = "parameter" if source is None else "offloaded" if held else row["holder"]
    why = ("of a tensor made before this forward (a weight, a persistent buffer)" if source is None
           else "kept for backward in the place of the tensor autograd saved")  # fmt: skip
    return {**row, "shape": copy.shape, "dtype": copy.dtype or copy.source_dtype or row["dtype"], "holder": kind,
            "evidence": f"{copy.describe()}, {why}" + (f" ({row['evidence']})" if held else ""),
            "source": "memory events + a pack hook's copy"}  # fmt: skip


def _backward_phases(idx: RankIndex) -> Intervals:
    marks = idx.phase_markers
    keep = [i for i in range(len(marks)) if marks.name(i) == markers.phase_name("backward")]
    return marks.subset(keep)


def _retained_from_memory(
    rec: Allocation, b: Boundary, idx: RankIndex, ops: Intervals, collectives: Intervals, own: Intervals,
    rules: HolderRules, call: Handed | None, slack: int, element_size: int | None,
    census: markers.ReleasedCensus | None = None,
) -> RetainedRow | None:  # fmt: skip
    """One allocation alive at boundary ``b``, with its holder from evidence
    (sptrace.detect.holders); None for a buffer a c10d call or the backend's worker made for
    itself inside the call (the backend's, never the model's)."""
    tid = int(rec.tid) if pd.notna(rec.tid) else None
    alloc_ns = int(rec.alloc_ns)
    inside = own.innermost(alloc_ns, alloc_ns, tid)
    if inside is not None and own.name(inside).startswith(_IN_PLACE):
        return None
    producer = producing_collective(collectives, ops, rec, slack, element_size)
    holder = rules.decide(rec, b, call, census)
    i = ops.innermost(alloc_ns, alloc_ns, tid)
    op = ops.row(i) if i is not None else None
    inferred = infer_shape(op, int(rec.bytes), element_size, slack) if op is not None else None
    module, _, _ = idx.module_of(alloc_ns, alloc_ns, tid if tid is not None else -1)
    freed_in = rules.freed_in(rec.free_ns) if not rec.lost_free else None
    return RetainedRow(
        module=module, layer=idx.layer_of(module),
        shape=None if inferred is None else inferred[0],
        dtype=None if inferred is None else inferred[1], nbytes=int(rec.bytes),
        storage_bytes=int(rec.bytes), storage_ptr=int(rec.addr),
        source="memory events" + (" + shape from the allocating op" if inferred else ""),
        alloc_op=None if op is None else str(op["name"]), producer=producer, saved_by=freed_in,
        holder=holder.kind, evidence=holder.evidence, alloc_ns=alloc_ns, free_ns=rec.free_ns, freed_in=freed_in,
        kind="activation", collective=call.collective if call is not None else None, call_key=None,
    )  # fmt: skip


def _op_name(ops: Intervals, ts: int, tid: object) -> str | None:
    """The innermost op running at ``ts`` on ``tid`` (a thread id as a table cell holds it: NaN or
    NA where missing, then on any thread)."""
    i = ops.innermost(ts, ts, int(tid) if tid is not None and not pd.isna(tid) else None)
    return None if i is None else ops.name(i)


_IN_PLACE = ("c10d::", "gloo:", "nccl:", "record_param_comms")
"""Collectives that write into tensors their caller made, and the backends' own annotations:
what they allocate inside is their own."""
