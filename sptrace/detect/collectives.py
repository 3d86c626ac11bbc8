"""Find every collective of every rank: kind, process group, bytes, timing, phase and layer.

Works on traces sptrace did not produce. Sources, best first, each recorded in ``source``:
  record_param_comms args (NCCL, newer PyTorch: Collective name, msg nelems, dtype, group, Seq),
  the c10d op's Input Dims and types (gloo, and NCCL without args),
  the nccl:* annotation's Input Dims (older NCCL traces), the GPU kernel (name or copied args).
A c10d op and the record_param_comms / nccl:* annotation / kernel it contains are one collective.
Phase comes from sptrace.phase markers when present, else from autograd's structure (after the
step's first backward node = backward; inside Optimizer.* = optimizer). Module and layer come
from sptrace markers, else from autograd's Sequence number links and python stacks.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd

from sptrace import markers
from sptrace.costmodel.comm import wire_bytes
from sptrace.detect.intervals import Intervals
from sptrace.load.trace import RankTrace, RunTrace

COLUMNS = [
    "rank", "kind", "op", "group", "group_size", "group_ranks", "dtype", "in_bytes", "out_bytes", "wire_bytes",
    "start_us", "dur_us", "comm_start_us", "comm_dur_us", "phase", "step", "layer", "module", "role", "seq",
    "source", "tid",
]  # fmt: skip

# c10d ops (the dispatcher names) -> kind. Functional collectives (compiled code, DTensor) too.
C10D_KINDS = {
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::allgather_coalesced_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::alltoall_base_": "all_to_all",
    "c10d::alltoall_": "all_to_all",
    "c10d::allreduce_": "all_reduce",
    "c10d::allreduce_coalesced_": "all_reduce",
    "c10d::broadcast_": "broadcast",
    "c10d::send": "send_recv",
    "c10d::recv_": "send_recv",
    "c10d::recv_any_source_": "send_recv",
    "c10d::barrier": "barrier",
    "c10d::gather_": "other",
    "c10d::scatter_": "other",
    "c10d::reduce_": "other",
    "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::all_gather_into_tensor_out": "all_gather",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::all_reduce_": "all_reduce",
    "_c10d_functional::all_to_all_single": "all_to_all",
    "_c10d_functional::broadcast": "broadcast",
}
# record_param_comms "Collective name" -> kind (None: not a collective, e.g. work.wait())
COLL_NAME_KINDS = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reducescatter": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_allv": "all_to_all",
    "broadcast": "broadcast", "send": "send_recv", "recv": "send_recv", "barrier": "barrier",
    "gather": "other", "scatter": "other", "reduce": "other", "wait": None, "coalesced": None,
}  # fmt: skip
NCCL_ANNOTATION_KINDS = {
    "nccl:all_reduce": "all_reduce", "nccl:all_gather": "all_gather", "nccl:_all_gather_base": "all_gather",
    "nccl:all_gather_into_tensor_coalesced": "all_gather", "nccl:reduce_scatter": "reduce_scatter",
    "nccl:_reduce_scatter_base": "reduce_scatter", "nccl:reduce_scatter_tensor_coalesced": "reduce_scatter",
    "nccl:all_to_all": "all_to_all", "nccl:all_to_allv": "all_to_all", "nccl:broadcast": "broadcast",
    "nccl:send": "send_recv", "nccl:recv": "send_recv", "nccl:barrier": "barrier",
    "nccl:allreduce_coalesced": "all_reduce",
}  # fmt: skip
GLOO_KINDS = {
    "gloo:all_gather": "all_gather", "gloo:all_reduce": "all_reduce", "gloo:all_to_all": "all_to_all",
    "gloo:reduce_scatter": "reduce_scatter", "gloo:broadcast": "broadcast", "gloo:barrier": "barrier",
}  # fmt: skip
# GPU kernels of collectives that never went through c10d: kind from the name
KERNEL_PATTERNS = (
    (re.compile(r"nccl(?:Dev)?Kernel_AllReduce", re.I), "all_reduce"),
    (re.compile(r"nccl(?:Dev)?Kernel_AllGather", re.I), "all_gather"),
    (re.compile(r"nccl(?:Dev)?Kernel_ReduceScatter", re.I), "reduce_scatter"),
    (re.compile(r"nccl(?:Dev)?Kernel_Broadcast", re.I), "broadcast"),
    (re.compile(r"nccl(?:Dev)?Kernel_SendRecv", re.I), "send_recv"),
    (re.compile(r"nccl(?:Dev)?Kernel_(?:Send|Recv)", re.I), "send_recv"),
    (re.compile(r"(?:one_shot|two_shot|multimem).*all_reduce", re.I), "all_reduce"),
    (re.compile(r"(?:multimem|symm).*all_gather", re.I), "all_gather"),
    (re.compile(r"nccl(?:Dev)?Kernel_Generic|ncclKernel", re.I), "other"),
)
SYMM_MEM_KINDS = (  # CPU ops of collectives that bypass c10d
    (re.compile(r"^symm_mem::.*all_reduce"), "all_reduce"),
    (re.compile(r"^symm_mem::.*(all_gather|allgather)"), "all_gather"),
    (re.compile(r"^symm_mem::.*reduce_scatter"), "reduce_scatter"),
    (re.compile(r"^symm_mem::.*all_to_all"), "all_to_all"),
    (re.compile(r"^symm_mem::"), "other"),
)
# element sizes: c10d "Input type" strings and record_param_comms "dtype" names
DTYPE_BYTES = {
    "float": 4, "c10::float": 4, "float32": 4, "Float": 4, "double": 8, "Double": 8, "float64": 8,
    "c10::Half": 2, "Half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2, "bfloat16": 2,
    "long int": 8, "long": 8, "int64_t": 8, "Long": 8, "int": 4, "Int": 4, "int32": 4, "short int": 2, "Short": 2,
    "signed char": 1, "unsigned char": 1, "Char": 1, "Byte": 1, "uint8": 1, "int8": 1, "bool": 1, "Bool": 1,
    "c10::Float8_e4m3fn": 1, "Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "Float8_e5m2": 1,
}  # fmt: skip
DTYPE_NAMES = {
    "float": "float32", "Float": "float32", "double": "float64", "Double": "float64", "c10::Half": "float16",
    "Half": "float16", "c10::BFloat16": "bfloat16", "BFloat16": "bfloat16", "long int": "int64", "Long": "int64",
    "int": "int32", "Int": "int32", "signed char": "int8", "Char": "int8", "unsigned char": "uint8", "Byte": "uint8",
    "bool": "bool", "Bool": "bool",
}  # fmt: skip
_LAYER_IN_PATH = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block|decoder\.layers)\.(\d+)(?:\.|$)")
_LAYER_MODULE = re.compile(r"nn\.Module: (\w*(?:Layer|Block)\w*)_(\d+)$")


def _dims(text: Any) -> list:
    if text is None or (isinstance(text, float) and np.isnan(text)) or text is pd.NA:
        return []
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return []
    return value if isinstance(value, list) else []


def _numel(shape: Any) -> int | None:
    """Elements of one shape; a list of shapes (TensorList) sums; [] is unknown."""
    if not isinstance(shape, list) or not shape:
        return None
    if all(isinstance(x, int) for x in shape):
        n = 1
        for x in shape:
            n *= x
        return n
    parts = [_numel(s) for s in shape]
    return sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None


def _present(value: Any) -> bool:
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value))


def layer_of(module: str | None) -> int | None:
    if not module:
        return None
    match = _LAYER_IN_PATH.search(module)
    return int(match.group(1)) if match else None


def _within(ranges: Intervals, points: np.ndarray) -> np.ndarray:
    """For each point: does a range (of any thread) contain it? Vectorised over the points:
    the latest range starting at or before the point, or any open range, must still run."""
    if not len(ranges) or not len(points):
        return np.zeros(len(points), dtype=bool)
    order = np.argsort(ranges.start, kind="stable")
    starts = ranges.start[order]
    running_end = np.maximum.accumulate(ranges.end[order])  # latest end among ranges begun so far
    pos = np.searchsorted(starts, points, side="right") - 1
    ok = pos >= 0
    result = np.zeros(len(points), dtype=bool)
    result[ok] = running_end[pos[ok]] >= points[ok]
    return result


class _RankIndex:
    """The ranges of one rank's trace that collectives are matched against."""

    def __init__(self, trace: RankTrace) -> None:
        ev = trace.events
        names = ev["name"].astype(str)
        cat = ev["cat"].astype(str)
        x = ev[ev["ph"].astype(str) == "X"]
        xn = names[x.index]
        self.events = ev
        self.phase_markers = Intervals(x[xn.str.startswith(markers.PHASE)])
        self.comm_markers = Intervals(x[xn.str.startswith(markers.COMM)])
        self.module_markers = Intervals(x[xn.str.startswith(markers.MODULE)])
        self.steps = Intervals(x[xn.str.startswith("ProfilerStep#")])
        self.backward_nodes = Intervals(x[xn.str.startswith("autograd::engine::evaluate_function")])
        self.optimizer = Intervals(x[xn.str.startswith("Optimizer.step") | xn.str.startswith("Optimizer.zero_grad")])
        self.python = Intervals(x[cat[x.index] == "python_function"])
        self.gloo = Intervals(x[xn.isin(list(GLOO_KINDS))])
        cpu = x[cat[x.index].isin(["cpu_op", "user_annotation"])]
        self.cpu_ops = cpu
        self.rpc = Intervals(cpu[names[cpu.index] == "record_param_comms"])
        self.nccl_annotations = Intervals(cpu[names[cpu.index].isin(list(NCCL_ANNOTATION_KINDS))])
        kernels = x[cat[x.index] == "kernel"]
        is_comm_kernel = names[kernels.index].map(lambda n: any(p.search(n) for p, _ in KERNEL_PATTERNS))
        self.comm_kernels = kernels[is_comm_kernel.astype(bool)]
        runtime = x[cat[x.index] == "cuda_runtime"]
        self.launches = runtime[runtime["correlation"].notna()]
        # forward ops by autograd sequence number (for backward attribution)
        with_seq = cpu[cpu["seq_num"].notna() & ~names[cpu.index].str.startswith("autograd::engine")]
        # forward ops run on the forward thread(s), outside backward nodes; the rest are backward ops
        in_backward = _within(self.backward_nodes, with_seq["ts_ns"].to_numpy(dtype=np.int64, na_value=0))
        self.backward_ops = Intervals(with_seq[in_backward])
        fwd = with_seq[~in_backward]
        # ops that create no autograd node (aten::to ...) record the current number too: the one
        # that created the node is the last to carry it
        self.forward_by_seq = fwd.drop_duplicates("seq_num", keep="last").set_index("seq_num")
        first_bwd = {}
        for i in range(len(self.steps) or 1):
            lo, hi = (self.steps.start[i], self.steps.end[i]) if len(self.steps) else (-(2**62), 2**62)
            inside = (self.backward_nodes.start >= lo) & (self.backward_nodes.start <= hi)
            if inside.any():
                first_bwd[i] = int(self.backward_nodes.start[inside].min())
        self.first_backward = first_bwd

    def step_of(self, ts: int) -> int | None:
        if not len(self.steps):
            return None
        idx = self.steps.enclosing(ts, ts)
        if not len(idx):
            return None
        name = str(self.steps.frame.iloc[int(idx[-1])]["name"])
        return int(name.split("#", 1)[1]) if name.split("#", 1)[1].isdigit() else None

    def phase_of(self, start: int, end: int, tid: int) -> str:
        i = self.phase_markers.innermost(start, start)  # any thread: backward may run elsewhere
        if i is not None:
            return str(self.phase_markers.frame.iloc[i]["name"])[len(markers.PHASE) :]
        if self.optimizer.innermost(start, end) is not None:
            return "optimizer"
        if self.backward_nodes.innermost(start, end, tid) is not None:
            return "backward"
        step_idx = 0
        if len(self.steps):
            idx = self.steps.enclosing(start, start)
            step_idx = int(idx[-1]) if len(idx) else -1
        first = self.first_backward.get(step_idx)
        if first is not None and start >= first:
            return "backward"
        return "forward"

    def module_of(self, start: int, end: int, tid: int) -> tuple[str | None, str | None, str]:
        """(module, role, how) for a collective issued in [start, end] on thread tid."""
        i = self.comm_markers.innermost(start, end, tid)
        if i is not None:
            parsed = markers.parse_comm(str(self.comm_markers.frame.iloc[i]["name"]))
            if parsed:
                return parsed[0], parsed[1], "sptrace.comm marker"
        i = self.module_markers.innermost(start, end, tid)
        if i is not None:
            return str(self.module_markers.frame.iloc[i]["name"])[len(markers.MODULE) :], None, "sptrace.module marker"
        node = self.backward_nodes.innermost(start, end, tid)
        if node is not None:
            # the node's own op (XBackward0 inside "evaluate_function: XBackward0") carries the
            # Sequence number of the forward op it differentiates
            node_row = self.backward_nodes.frame.iloc[node]
            seq = node_row["seq_num"]
            if not _present(seq):
                lo, hi = int(self.backward_nodes.start[node]), int(self.backward_nodes.end[node])
                inner = self.backward_ops.inside(lo, hi, tid)
                if len(inner):
                    own = str(node_row["name"]).rpartition(": ")[2]
                    ops = self.backward_ops.frame.iloc[inner].sort_values("ts_ns", kind="stable")
                    named = ops[ops["name"].astype(str) == own]
                    seq = (named if len(named) else ops).iloc[0]["seq_num"]
            if _present(seq) and seq in self.forward_by_seq.index:
                op = self.forward_by_seq.loc[seq]
                fstart, fend = int(op["ts_ns"]), int(op["ts_ns"] + (op["dur_ns"] if _present(op["dur_ns"]) else 0))
                j = self.module_markers.innermost(fstart, fend, int(op["tid"]) if _present(op["tid"]) else None)
                if j is not None:
                    return (
                        str(self.module_markers.frame.iloc[j]["name"])[len(markers.MODULE) :],
                        None,
                        "Sequence number",
                    )
                module = self._python_module(fstart, fend, int(op["tid"]) if _present(op["tid"]) else None)
                if module:
                    return module, None, "Sequence number + python stack"
        module = self._python_module(start, end, tid)
        if module:
            return module, None, "python stack"
        return None, None, "none"

    def _python_module(self, start: int, end: int, tid: int | None) -> str | None:
        if not len(self.python):
            return None
        idx = self.python.enclosing(start, end, tid)
        names = [str(self.python.frame.iloc[int(i)]["name"]) for i in idx]
        modules = [n for n in names if n.startswith("nn.Module: ")]
        if not modules:
            return None
        layer = next((m for m in reversed(modules) if _LAYER_MODULE.search(m)), None)
        inner = modules[-1][len("nn.Module: ") :]
        if layer:
            _, n = _LAYER_MODULE.search(layer).groups()
            return f"layers.{n}" + ("" if layer == modules[-1] else f".{inner}")
        return inner


def detect_collectives(trace: RankTrace) -> pd.DataFrame:
    """One row per collective this rank issued (COLUMNS), in issue order."""
    idx = _RankIndex(trace)
    ev = idx.events
    rank = trace.rank
    world = trace.world_size
    default_group = _default_group(trace)
    names = ev["name"].astype(str)
    cpu = idx.cpu_ops
    cpu_names = names[cpu.index]
    anchors = cpu[cpu_names.isin(list(C10D_KINDS)) | cpu_names.str.startswith("symm_mem::")]
    anchor_iv = Intervals(anchors)
    # a c10d op nested in another (functional wrapper around c10d) counts once: keep outermost
    keep = [anchor_iv.enclosing(s, e, t).size <= 1 for s, e, t in zip(anchor_iv.start, anchor_iv.end, anchor_iv.tid)]
    anchors = anchors[np.array(keep, dtype=bool)] if len(anchors) else anchors
    anchor_iv = Intervals(anchors)
    rows: list[dict[str, Any]] = []
    claimed_rpc: set[int] = set()
    claimed_nccl: set[int] = set()
    for i in range(len(anchor_iv)):
        op = anchor_iv.frame.iloc[i]
        start, end, tid = int(anchor_iv.start[i]), int(anchor_iv.end[i]), int(anchor_iv.tid[i])
        name = str(op["name"])
        kind = C10D_KINDS.get(name) or next(k for p, k in SYMM_MEM_KINDS if p.search(name))
        rpcs = idx.rpc.inside(start, end, tid)
        nccl = idx.nccl_annotations.inside(start, end, tid)
        claimed_rpc.update(int(j) for j in rpcs)
        claimed_nccl.update(int(j) for j in nccl)
        rpc = idx.rpc.frame.iloc[int(rpcs[0])] if len(rpcs) else None
        note = idx.nccl_annotations.frame.iloc[int(nccl[0])] if len(nccl) else None
        rows.append(_collective(idx, rank, world, default_group, name, kind, start, end, tid, op, rpc, note))
    # record_param_comms / nccl annotations with no c10d op around them (older NCCL paths)
    for j in range(len(idx.rpc)):
        if j in claimed_rpc:
            continue
        rpc = idx.rpc.frame.iloc[j]
        kind = COLL_NAME_KINDS.get(str(rpc["coll_name"])) if _present(rpc["coll_name"]) else None
        start, end, tid = int(idx.rpc.start[j]), int(idx.rpc.end[j]), int(idx.rpc.tid[j])
        nccl = idx.nccl_annotations.inside(start, end, tid)
        claimed_nccl.update(int(k) for k in nccl)
        note = idx.nccl_annotations.frame.iloc[int(nccl[0])] if len(nccl) else None
        if kind is None and note is not None:
            kind = NCCL_ANNOTATION_KINDS[str(note["name"])]
        if kind is None:
            continue  # work.wait() and unlabelled bookkeeping: not a collective
        rows.append(
            _collective(idx, rank, world, default_group, "record_param_comms", kind, start, end, tid, rpc, rpc, note)
        )
    for j in range(len(idx.nccl_annotations)):
        if j in claimed_nccl:
            continue
        note = idx.nccl_annotations.frame.iloc[j]
        start, end, tid = (
            int(idx.nccl_annotations.start[j]),
            int(idx.nccl_annotations.end[j]),
            int(idx.nccl_annotations.tid[j]),
        )
        kind = NCCL_ANNOTATION_KINDS[str(note["name"])]
        rows.append(
            _collective(idx, rank, world, default_group, str(note["name"]), kind, start, end, tid, note, None, note)
        )
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "_start_ns", "_end_ns"])
    frame = _attach_device_time(idx, frame)
    return frame.sort_values("start_us", kind="stable").reset_index(drop=True)[COLUMNS]


def _default_group(trace: RankTrace) -> tuple[str, int | None, list[int] | None]:
    for g in trace.process_groups:
        if g.get("pg_desc") == "default_pg" or g.get("pg_name") == "0":
            return str(g.get("pg_name")), g.get("pg_size"), g.get("ranks")
    return "0", trace.world_size, list(range(trace.world_size)) if trace.world_size else None


def _collective(
    idx: _RankIndex, rank: int | None, world: int | None, default_group: tuple, op_name: str, kind: str,
    start: int, end: int, tid: int, op: Any, rpc: Any, note: Any,
) -> dict[str, Any]:  # fmt: skip
    in_elems = out_elems = None
    elem = None
    dtype = None
    source = []
    group, group_size, group_ranks = default_group
    group_known = False
    seq = None
    if rpc is not None and _present(rpc.get("coll_name")):
        if _present(rpc.get("coll_dtype")):
            dtype_name = str(rpc["coll_dtype"])
            elem, dtype = DTYPE_BYTES.get(dtype_name), DTYPE_NAMES.get(dtype_name, dtype_name.lower())
        if _present(rpc.get("in_nelems")):
            in_elems, out_elems = (
                int(rpc["in_nelems"]),
                int(rpc["out_nelems"]) if _present(rpc.get("out_nelems")) else None,
            )
            source.append("record_param_comms args")
        if _present(rpc.get("pg_name")):
            group, group_known = str(rpc["pg_name"]), True
        if _present(rpc.get("group_size")):
            group_size = int(rpc["group_size"])
        if _present(rpc.get("pg_ranks")):
            try:
                parsed = json.loads(str(rpc["pg_ranks"]))
                group_ranks = parsed if isinstance(parsed, list) and parsed else group_ranks
            except ValueError:
                pass
        if _present(rpc.get("comm_seq")):
            seq = int(rpc["comm_seq"])
    if in_elems is None:
        dims = _dims(op.get("input_dims"))
        types = _dims(op.get("input_types"))
        got = _sizes_from_dims(kind, op_name, dims, types)
        if got is not None:
            in_elems, out_elems, type_name = got
            source.append("c10d Input Dims")
            if type_name and elem is None:
                elem, dtype = DTYPE_BYTES.get(type_name), DTYPE_NAMES.get(type_name, type_name)
    if in_elems is None and note is not None:
        dims, types = _dims(note.get("input_dims")), _dims(note.get("input_types"))
        n = _numel(dims[0]) if dims else None
        if n is not None:
            in_elems = n
            out_elems = n * (group_size or 1) if kind == "all_gather" else n
            source.append("nccl annotation Input Dims")
            if types and isinstance(types[0], str) and elem is None:
                elem, dtype = DTYPE_BYTES.get(types[0]), DTYPE_NAMES.get(types[0], types[0])
    module, role, how = idx.module_of(start, end, tid)
    if role and "|dtype=" in role:
        role, _, marker_dtype = role.partition("|dtype=")
        if elem is None:
            elem = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4}.get(marker_dtype)
            dtype = marker_dtype
            source.append("dtype from sptrace.comm marker")
    if elem is None and in_elems is not None:
        elem, dtype = 4, "float32?"
        source.append("dtype unknown (a TensorList on gloo): 4 bytes assumed")
    if in_elems is not None and out_elems is None:
        out_elems = in_elems
    if not group_known:
        source.append("group assumed default")
    in_bytes = in_elems * elem if in_elems is not None and elem else None
    out_bytes = out_elems * elem if out_elems is not None and elem else None
    size = group_size or world or 1
    wire = wire_bytes(kind, in_bytes or 0, out_bytes or 0, size) if in_bytes is not None else None
    return {
        "rank": rank, "kind": kind, "op": op_name, "group": group, "group_size": size, "group_ranks": group_ranks,
        "dtype": dtype, "in_bytes": in_bytes, "out_bytes": out_bytes, "wire_bytes": wire,
        "start_us": start / 1000, "dur_us": (end - start) / 1000, "comm_start_us": None, "comm_dur_us": None,
        "phase": idx.phase_of(start, end, tid), "step": idx.step_of(start), "layer": layer_of(module),
        "module": module, "role": role, "seq": seq, "source": "; ".join([*source, f"module: {how}"]), "tid": tid,
        "_start_ns": start, "_end_ns": end,
    }  # fmt: skip


def _sizes_from_dims(kind: str, op_name: str, dims: list, types: list) -> tuple[int, int, str | None] | None:
    """(in elements, out elements, type name) from a c10d op's Input Dims / Input type.
    The *_base_ ops list output then input (SPEC.md §4); list ops list tensors in lists."""
    if not dims:
        return None
    type_name = next((t for t in types if isinstance(t, str) and t in DTYPE_BYTES), None)
    if op_name in ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::alltoall_base_"):
        if len(dims) < 2:
            return None
        out_n, in_n = _numel(dims[0]), _numel(dims[1])
        return (in_n, out_n, type_name) if in_n is not None and out_n is not None else None
    if op_name.startswith("_c10d_functional::"):
        n = _numel(dims[0])
        if n is None:
            return None
        return n, n, type_name  # group size unknown here; all_gather's output fixed up by the caller
    if op_name in ("c10d::allgather_", "c10d::allgather_coalesced_"):
        out_n, in_n = _numel(dims[0]), _numel(dims[1]) if len(dims) > 1 else None
        return (in_n, out_n, type_name) if in_n is not None and out_n is not None else None
    if op_name in ("c10d::reduce_scatter_", "c10d::alltoall_"):
        out_n, in_n = _numel(dims[0]), _numel(dims[1]) if len(dims) > 1 else None
        return (in_n, out_n, type_name) if in_n is not None and out_n is not None else None
    n = _numel(dims[0])
    return (n, n, type_name) if n is not None else None


def _attach_device_time(idx: _RankIndex, frame: pd.DataFrame) -> pd.DataFrame:
    """GPU kernels (via their launch's correlation) or gloo worker annotations, per collective;
    kernels no CPU op claims become collectives of their own."""
    if frame.empty and not len(idx.comm_kernels):
        return frame
    starts = frame["_start_ns"].to_numpy(dtype=np.int64) if len(frame) else np.empty(0, np.int64)
    ends = frame["_end_ns"].to_numpy(dtype=np.int64) if len(frame) else np.empty(0, np.int64)
    comm_start = [None] * len(frame)
    comm_dur = [None] * len(frame)
    extra: list[dict[str, Any]] = []
    if len(idx.comm_kernels):
        launch_by_corr = idx.launches.drop_duplicates("correlation").set_index("correlation")
        for _, k in idx.comm_kernels.iterrows():
            corr = k["correlation"]
            owner = None
            if _present(corr) and corr in launch_by_corr.index:
                t = int(launch_by_corr.loc[corr]["ts_ns"])
                inside = np.flatnonzero((starts <= t) & (t <= ends))
                if len(inside):
                    owner = int(inside[np.argmax(starts[inside])])
            kstart, kdur = int(k["ts_ns"]) / 1000, (int(k["dur_ns"]) if _present(k["dur_ns"]) else 0) / 1000
            if owner is not None and comm_start[owner] is None:
                comm_start[owner], comm_dur[owner] = kstart, kdur
            elif owner is None:
                extra.append(_kernel_only(idx, k, frame))
    if len(idx.gloo) and len(frame):
        taken: set[int] = set()
        order = np.argsort(idx.gloo.start)
        for g in order:
            gs = int(idx.gloo.start[g])
            kind = GLOO_KINDS[str(idx.gloo.frame.iloc[int(g)]["name"])]
            # gloo implements reduce-scatter as an all-reduce (SPEC.md §4)
            fits = {kind, "reduce_scatter"} if kind == "all_reduce" else {kind}
            cands = [
                i for i in np.flatnonzero(starts <= gs)
                if i not in taken and comm_start[i] is None and frame.iloc[i]["kind"] in fits
            ]  # fmt: skip
            if cands:
                i = max(cands, key=lambda c: starts[c])
                taken.add(i)
                comm_start[i], comm_dur[i] = gs / 1000, (idx.gloo.end[g] - gs) / 1000
    frame = frame.copy()
    frame["comm_start_us"] = comm_start
    frame["comm_dur_us"] = comm_dur
    if extra:
        frame = pd.concat([frame, pd.DataFrame(extra)], ignore_index=True)
    return frame


def _kernel_only(idx: _RankIndex, k: Any, frame: pd.DataFrame) -> dict[str, Any]:
    name = str(k["name"])
    kind = next(kd for p, kd in KERNEL_PATTERNS if p.search(name))
    in_bytes = out_bytes = None
    dtype = None
    source = ["GPU kernel name"]
    if _present(k.get("coll_name")) and COLL_NAME_KINDS.get(str(k["coll_name"])):
        kind = COLL_NAME_KINDS[str(k["coll_name"])]  # RCCL's ncclDevKernel_Generic: the args tell
        source = ["args copied onto the GPU kernel"]
        if _present(k.get("coll_dtype")) and _present(k.get("in_nelems")):
            elem = DTYPE_BYTES.get(str(k["coll_dtype"]))
            dtype = DTYPE_NAMES.get(str(k["coll_dtype"]), str(k["coll_dtype"]))
            if elem:
                in_bytes = int(k["in_nelems"]) * elem
                out_bytes = int(k["out_nelems"]) * elem if _present(k.get("out_nelems")) else in_bytes
    size = int(k["group_size"]) if _present(k.get("group_size")) else None
    start = int(k["ts_ns"])
    dur = int(k["dur_ns"]) if _present(k["dur_ns"]) else 0
    return {
        "rank": frame["rank"].iloc[0] if len(frame) else None, "kind": kind, "op": name[:80], "group": None,
        "group_size": size, "group_ranks": None, "dtype": dtype, "in_bytes": in_bytes, "out_bytes": out_bytes,
        "wire_bytes": wire_bytes(kind, in_bytes or 0, out_bytes or 0, size or 1) if in_bytes is not None else None,
        "start_us": start / 1000, "dur_us": dur / 1000, "comm_start_us": start / 1000, "comm_dur_us": dur / 1000,
        "phase": idx.phase_of(start, start + dur, -1), "step": idx.step_of(start), "layer": None, "module": None,
        "role": None, "seq": None, "source": "; ".join([*source, "kernel only: no CPU op found"]), "tid": None,
        "_start_ns": start, "_end_ns": start + dur,
    }  # fmt: skip


def detect_run_collectives(run: RunTrace) -> pd.DataFrame:
    frames = [detect_collectives(t) for t in run]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)
