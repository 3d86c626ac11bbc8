"""One collective's row of a rank's table, read off the events it is made of
(sptrace.detect.collective_events): sizes, element type, group, peer, wire bytes, times, phase,
step, module and layer, and what each came from (``source``) or why it is unknown (``unknown``).

Sizes, element type and group, each from the best source the trace has, named in ``source``:
  record_param_comms args (NCCL: Collective name, msg nelems, dtype, Group size, group name, Seq),
  the op's own Input Dims / Input type / Concrete Inputs, read per op signature (sptrace.detect.forms),
  the matched gloo worker annotation (gloo: the element type of TensorList ops),
  the nccl:* annotation's Input Dims (older NCCL traces),
  the kernel's copied args, the process groups of ``distributedInfo``, and the out/in ratio of a
  gather or scatter. What cannot be known is null, and ``unknown`` says what and why.
Phase comes from sptrace.phase markers when present, else from autograd's structure. Module and
layer come from sptrace markers, else from autograd's Sequence number links and python stacks.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TypedDict

from sptrace.detect import forms
from sptrace.detect.args import present
from sptrace.detect.collective_events import CollectiveEvents, transfer_span
from sptrace.detect.groups import GroupTable, PeerCandidate
from sptrace.detect.index import RankIndex
from sptrace.vocab import dtypes
from sptrace.vocab.collective_kinds import wire_bytes


class CollectiveRecord(TypedDict):
    """One collective of a rank's table (RANK_COLUMNS), as ``read_record`` reads it off its events:
    a TypedDict, as the table is made of these records."""

    rank: int | None
    kind: str
    op: str
    group: str | None
    group_size: int | None
    group_ranks: list[int] | None
    peer: int | None
    dtype: str | None
    in_elems: int | None
    out_elems: int | None
    in_bytes: int | None
    out_bytes: int | None
    wire_bytes: float | None
    start_us: float
    dur_us: float
    transfer_start_us: float | None
    transfer_dur_us: float | None
    phase: str | None
    step: int | None
    layer: int | None
    module: str | None
    role: str | None
    seq: int | None
    source: str
    unknown: str | None
    tid: int | None
    peer_candidates: list[PeerCandidate] | None


def read_record(idx: RankIndex, rank: int | None, groups: GroupTable, row: CollectiveEvents) -> CollectiveRecord:
    """One collective's row of the table, read off its events (module docstring)."""
    source: list[str] = []
    unknown: list[str] = []
    sizes = forms.Sizes()
    group_name: str | None = None
    group_size: int | None = None
    group_ranks: list | None = None
    seq = None
    peer = None
    rpc = row.rpc
    # 1. record_param_comms args (NCCL); the kernel's copied args for a kernel-only row
    args_event = rpc if rpc is not None and present(rpc.get("coll_name")) else None
    if args_event is None and row.anchor == "kernel" and present(getattr(row.event, "coll_name", None)):
        args_event = row.event
    if args_event is not None:
        got = forms.sizes_from_record(args_event)
        if got.in_elems is not None:
            sizes = got
            source.append("bytes: record_param_comms args" if row.anchor != "kernel" else "bytes: kernel args")
        if present(args_event.get("pg_name")):
            group_name = str(args_event["pg_name"])
        if present(args_event.get("group_size")):
            group_size = int(args_event["group_size"])
        if present(args_event.get("pg_ranks")):
            try:
                parsed = json.loads(str(args_event["pg_ranks"]))
                group_ranks = parsed if isinstance(parsed, list) and parsed else None
            except ValueError:
                pass
        if present(args_event.get("comm_seq")):
            seq = int(args_event["comm_seq"])
        if row.kind in ("send", "recv") and present(args_event.get("comm_rank")):
            peer = int(args_event["comm_rank"])
        if group_name is not None or group_size is not None:
            source.append("group: record_param_comms args")
    # 2. the op's own signature (c10d, functional), and a c10d op nested in a functional one
    op_sizes = forms.sizes_from_op(row.op, row.event) if row.anchor == "op" else forms.Sizes()
    if row.inner is not None:
        op_sizes = op_sizes.merge(forms.sizes_from_op(str(row.inner["name"]), row.inner))
    if op_sizes.group_size is not None and group_size is None:
        group_size = op_sizes.group_size
        source.append(f"group size: {row.op} arguments")
    if peer is None and op_sizes.peer is not None:
        peer = op_sizes.peer
    if sizes.in_elems is None and (op_sizes.in_elems is not None or op_sizes.out_elems is not None):
        sizes = op_sizes
        source.append(f"bytes: {'c10d' if row.op.startswith('c10d') else 'op'} Input Dims")
    elif sizes.dtype is None and op_sizes.dtype is not None:
        sizes = sizes.merge(op_sizes)
    # 3. older NCCL traces: the nccl:* annotation's Input Dims
    if sizes.in_elems is None and sizes.out_elems is None and row.note is not None:
        got = forms.sizes_from_annotation(row.kind, row.note)
        if got.in_elems is not None:
            sizes = sizes.merge(got)
            source.append("bytes: nccl annotation Input Dims")
    # 4. gloo: the worker annotation knows the element type of TensorList ops, and a root
    # scatter's (or list all-to-all's) input: one tensor per member of the group
    if row.gloo:
        got = forms.sizes_from_annotation(row.kind, row.gloo[0])
        if sizes.in_elems is None and got.in_elems is not None:
            sizes = dataclasses.replace(sizes, in_elems=got.in_elems, why_in=None).merge(got)
            source.append("bytes: gloo annotation Input Dims")
        if sizes.dtype is None and got.dtype is not None:
            sizes = dataclasses.replace(sizes, dtype=got.dtype)
            source.append("dtype: gloo annotation")
        if group_size is None and got.group_size is not None:
            group_size = got.group_size
            source.append("group size: gloo annotation (one tensor per member)")
    # the marker of a collective issued by sptrace's reference models names its dtype and group
    # size (role|dtype=...|group=...): what a TensorList op or an unnamed group leaves unsaid
    module, role, how = idx.module_of(row.start, row.end, row.tid if row.tid is not None else -1)
    if role and "|" in role:
        role, *fields = role.split("|")
        meta = dict(f.partition("=")[::2] for f in fields)
        marker_dtype, marker_group = meta.get("dtype", ""), meta.get("group", "")
        if sizes.dtype is None and dtypes.canonical(marker_dtype):
            sizes = sizes.merge(forms.Sizes(dtype=marker_dtype))
            source.append("dtype: sptrace.comm marker")
        if group_size is None and marker_group.isdigit():
            group_size = int(marker_group)
            source.append("group size: sptrace.comm marker")
    # 5. the group: named by the op, else this rank's process groups, else the out/in ratio
    group_name, size2, ranks2, how_group = groups.resolve(group_name, group_size)
    group_size = group_size or size2
    group_ranks = group_ranks or ranks2
    if how_group:
        source.append(f"group: {how_group}")
    if group_size is None:
        ratio = sizes.ratio_group_size(row.kind)
        if ratio is not None:
            group_size = ratio
            source.append("group size: out/in ratio")
    if group_size is None and row.kind not in ("send", "recv"):
        unknown.append("group size: the trace records no process group for it")
    sizes = sizes.complete(row.kind, group_size)
    elem = dtypes.element_size(sizes.dtype)
    if sizes.dtype is None:
        unknown.append("dtype: not recorded (a TensorList op without a worker annotation)")
    elif elem is None:
        unknown.append(f"element size of dtype {sizes.dtype!r}")
    in_bytes = sizes.in_elems * elem if sizes.in_elems is not None and elem else None
    out_bytes = sizes.out_elems * elem if sizes.out_elems is not None and elem else None
    if sizes.in_elems is None:
        unknown.append(f"in bytes: {sizes.why_in or 'no sizes recorded'}")
    if sizes.out_elems is None:
        unknown.append(f"out bytes: {sizes.why_out or 'no sizes recorded'}")
    candidates = None
    if peer is not None and group_ranks and 0 <= peer < len(group_ranks):
        peer = int(group_ranks[peer])  # the op names the peer by its rank in the group
    elif peer is not None and row.kind in ("send", "recv"):
        # the group is unnamed (c10d::send records none): the peer's rank in which group?
        options = groups.peer_candidates(peer)
        if len({o["peer"] for o in options}) == 1:
            peer = options[0]["peer"]
            if len(options) == 1:
                group_name, group_size, group_ranks = options[0]["group"], options[0]["size"], options[0]["ranks"]
        elif options:
            unknown.append(f"peer: rank {peer} of a process group the trace does not name ({len(options)} fit)")
            candidates, peer = options, None  # resolve_peers decides from the partners' traces
    wire = None
    if row.kind in ("barrier",):
        wire = 0.0
    elif row.kind in ("send", "recv") and in_bytes is not None:
        wire = wire_bytes(row.kind, in_bytes, out_bytes or in_bytes, 2)
    elif in_bytes is not None and out_bytes is not None and group_size is not None:
        wire = wire_bytes(row.kind, in_bytes, out_bytes, group_size)
    transfer = transfer_span(row)
    if transfer is None and row.anchor == "op":
        unknown.append("transfer time: no NCCL kernel or gloo annotation linked to it")
    if row.kernels:
        source.append(f"transfer: {len(row.kernels)} GPU kernel{'s' if len(row.kernels) > 1 else ''}")
    elif row.gloo:
        source.append("transfer: gloo worker annotation")
    if row.anchor == "kernel":
        source.insert(0, "kernel only: no CPU op launched it")
    elif row.anchor == "gloo":
        source.insert(0, "gloo annotation only: no c10d op in the trace")
    source.append(f"module: {how}")
    dtype_name = dtypes.canonical(sizes.dtype) or sizes.dtype
    return {
        "rank": rank, "kind": row.kind, "op": row.op, "group": group_name, "group_size": group_size,
        "group_ranks": group_ranks, "peer": peer, "dtype": dtype_name, "in_elems": sizes.in_elems,
        "out_elems": sizes.out_elems, "in_bytes": in_bytes, "out_bytes": out_bytes,
        "wire_bytes": wire, "start_us": row.start / 1000, "dur_us": (row.end - row.start) / 1000,
        "transfer_start_us": None if transfer is None else transfer[0] / 1000,
        "transfer_dur_us": None if transfer is None else (transfer[1] - transfer[0]) / 1000,
        "phase": idx.phase_of(row.start, row.end, row.tid if row.tid is not None else -1),
        "step": idx.step_of(row.start), "layer": idx.layer_of(module), "module": module, "role": role, "seq": seq,
        "source": "; ".join(source), "unknown": "; ".join(unknown) or None, "tid": row.tid,
        "peer_candidates": candidates,
    }  # fmt: skip
