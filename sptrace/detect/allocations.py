"""Allocations from ``[memory]`` events, and the activations a step keeps for backward.

Ledger (SPEC.md §5): events sorted by (ts, Ev Idx), keyed by (device type, device id, Addr). An
allocation on an address still live means its free was never recorded (gloo worker threads
lose frees): the old record is closed there as ``lost_free``. A free with no allocation
predates profiling and is ignored. On CUDA, Bytes is the caching allocator's block size.

Saved tensors: the sptrace.saved records (exact module, shape, dtype, storage) when the trace
has them; otherwise allocations made in the forward window, still alive when backward starts,
and freed inside an autograd ``evaluate_function`` node (which excludes communication buffers,
the loss and leaks), with a shape inferred from the allocating op's input dims where the bytes
fit one.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from sptrace import markers
from sptrace.detect.intervals import Intervals
from sptrace.load.trace import RankTrace

LEDGER_COLUMNS = ["device_type", "device_id", "addr", "bytes", "alloc_ns", "free_ns", "lost_free", "tid"]
SAVED_COLUMNS = [
    "rank", "module", "layer", "shape", "dtype", "nbytes", "storage_bytes", "storage_ptr", "source",
    "alloc_op", "saved_by", "alloc_ns", "free_ns", "freed_in", "kind",
]  # fmt: skip


def detect_ledger(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    mem = ev[(ev["name"].astype(str) == "[memory]") & ev["mem_addr"].notna() & ev["mem_bytes"].notna()]
    mem = mem.sort_values(["ts_ns", "ev_idx"], kind="stable", na_position="first")
    live: dict[tuple, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for dt, di, addr, nbytes, ts, tid in zip(
        mem["device_type"].fillna(-1),
        mem["device_id"].fillna(-1),
        mem["mem_addr"],
        mem["mem_bytes"],
        mem["ts_ns"],
        mem["tid"],
    ):
        key = (int(dt), int(di), int(addr))
        if nbytes > 0:
            old = live.pop(key, None)
            if old is not None:
                old.update(free_ns=int(ts), lost_free=True)
                rows.append(old)
            live[key] = {"device_type": key[0], "device_id": key[1], "addr": key[2], "bytes": int(nbytes),
                         "alloc_ns": int(ts), "free_ns": None, "lost_free": False, "tid": tid}  # fmt: skip
        elif nbytes < 0:
            rec = live.pop(key, None)
            if rec is not None:
                rec["free_ns"] = int(ts)
                rows.append(rec)
    rows.extend(live.values())
    frame = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    return frame.sort_values("alloc_ns", kind="stable").reset_index(drop=True)


def backward_start_ns(trace: RankTrace) -> int | None:
    ev = trace.events
    names = ev["name"].astype(str)
    phase = ev[names == markers.phase_name("backward")]
    if len(phase):
        return int(phase["ts_ns"].min())
    nodes = ev[names.str.startswith("autograd::engine::evaluate_function")]
    return int(nodes["ts_ns"].min()) if len(nodes) else None


def forward_start_ns(trace: RankTrace) -> int:
    ev = trace.events
    names = ev["name"].astype(str)
    for marker in (markers.phase_name("forward"), "ProfilerStep#"):
        hit = ev[names.str.startswith(marker)]
        if len(hit):
            return int(hit["ts_ns"].min())
    return int(ev["ts_ns"].min())


def _layer(module: str | None) -> int | None:
    from sptrace.detect.collectives import layer_of

    return layer_of(module)


def detect_saved_activations(trace: RankTrace, *, element_size: int = 4) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(saved activations, ledger). One row per saved storage (a tensor saved twice counts once)."""
    ledger = detect_ledger(trace)
    ev = trace.events
    names = ev["name"].astype(str)
    bwd = backward_start_ns(trace)
    fwd = forward_start_ns(trace)
    nodes = Intervals(ev[names.str.startswith("autograd::engine::evaluate_function")])
    records = ev[names.str.startswith(markers.SAVED)]
    cpu_ops = ev[(ev["cat"].astype(str) == "cpu_op") & (ev["ph"].astype(str) == "X")]
    op_iv = Intervals(cpu_ops[~cpu_ops["name"].astype(str).str.startswith("sptrace.")])
    rows: list[dict[str, Any]] = []
    if len(records):
        seen: set[int] = set()
        for name, ts, tid in zip(records["name"].astype(str), records["ts_ns"], records["tid"]):
            rec = markers.SavedTensor.from_marker(name)
            # weights are not activations; data without autograd history ("input") still costs memory
            if rec is None or rec.kind == "param" or rec.storage_ptr in seen:
                continue
            if bwd is not None and ts >= bwd:
                continue  # recomputation in backward saves again: not kept across the step
            seen.add(rec.storage_ptr)
            alloc = _allocation_at(ledger, rec.storage_ptr, int(ts))
            # the op that allocated the storage, and the op saving it (the marker sits inside it)
            made_by = _op_at(op_iv, int(alloc["alloc_ns"]), alloc["tid"]) if alloc is not None else None
            saving = _op_at(op_iv, int(ts), tid)
            rows.append({
                "rank": trace.rank, "module": rec.module, "layer": _layer(rec.module), "shape": rec.shape,
                "dtype": rec.dtype, "nbytes": rec.nbytes, "storage_bytes": rec.storage_nbytes,
                "storage_ptr": rec.storage_ptr, "source": "sptrace.saved record",
                "alloc_op": made_by, "saved_by": saving,
                "alloc_ns": None if alloc is None else alloc["alloc_ns"],
                "free_ns": None if alloc is None else alloc["free_ns"],
                "freed_in": None if alloc is None else _freed_in(nodes, alloc), "kind": rec.kind,
            })  # fmt: skip
        return pd.DataFrame(rows, columns=SAVED_COLUMNS), ledger
    if bwd is None:
        return pd.DataFrame(columns=SAVED_COLUMNS), ledger
    from sptrace.detect.collectives import _RankIndex

    index = _RankIndex(trace)
    tolerance = _CUDA_SLACK if (ledger["device_type"] == 1).any() else 0
    kept = ledger[(ledger["alloc_ns"] >= fwd) & (ledger["alloc_ns"] < bwd)]
    kept = kept[kept["free_ns"].isna() | (kept["free_ns"] >= bwd)]
    for rec in kept.to_dict(orient="records"):
        if rec["lost_free"]:
            continue  # its free was lost (gloo worker threads): when it died is unknown
        freed_in = _freed_in(nodes, rec)
        if freed_in is None:
            continue  # never freed by an autograd node: a buffer, the loss, a leak
        tid = int(rec["tid"]) if pd.notna(rec["tid"]) else None
        i = op_iv.innermost(int(rec["alloc_ns"]), int(rec["alloc_ns"]), tid)
        op = op_iv.frame.iloc[i] if i is not None else None
        shape = _infer_shape(op, int(rec["bytes"]), element_size, tolerance) if op is not None else None
        module, _, _ = index.module_of(int(rec["alloc_ns"]), int(rec["alloc_ns"]), tid if tid is not None else -1)
        rows.append({
            "rank": trace.rank, "module": module, "layer": _layer(module), "shape": shape,
            "dtype": None, "nbytes": int(rec["bytes"]), "storage_bytes": int(rec["bytes"]),
            "storage_ptr": int(rec["addr"]), "source": "memory events" + (" + shape from op inputs" if shape else ""),
            "alloc_op": None if op is None else str(op["name"]), "saved_by": freed_in,
            "alloc_ns": rec["alloc_ns"], "free_ns": rec["free_ns"], "freed_in": freed_in, "kind": "activation",
        })  # fmt: skip
    return pd.DataFrame(rows, columns=SAVED_COLUMNS), ledger


_CUDA_SLACK = 2**20
"""The CUDA caching allocator's block can exceed the request by up to ~1 MiB (SPEC.md §4)."""


def _op_at(ops: Intervals, ts: int, tid: Any) -> str | None:
    i = ops.innermost(ts, ts, int(tid) if tid is not None and not pd.isna(tid) else None)
    return None if i is None else str(ops.frame.iloc[i]["name"])


def _allocation_at(ledger: pd.DataFrame, addr: int, ts: int) -> dict[str, Any] | None:
    hit = ledger[
        (ledger["addr"] == addr) & (ledger["alloc_ns"] <= ts) & (ledger["free_ns"].isna() | (ledger["free_ns"] > ts))
    ]
    return None if hit.empty else hit.iloc[-1].to_dict()


def _freed_in(nodes: Intervals, rec: dict[str, Any]) -> str | None:
    free = rec.get("free_ns")
    if free is None or pd.isna(free):
        return None
    i = nodes.innermost(int(free), int(free))
    return None if i is None else str(nodes.frame.iloc[i]["name"]).rpartition(": ")[2]


def _infer_shape(op: Any, nbytes: int, element_size: int, tolerance: int = 0) -> tuple[int, ...] | None:
    """A shape among the allocating op's inputs whose size is ``nbytes`` (the output of
    elementwise ops, copies and norms has an input's shape), or, on CUDA, fits the allocator's
    block with at most ``tolerance`` to spare (the closest wins); None when none fits."""
    text = op.get("input_dims")
    if text is None or pd.isna(text):
        return None
    try:
        dims = json.loads(text)
    except ValueError:
        return None
    best: tuple[int, tuple[int, ...]] | None = None
    for shape in dims:
        if isinstance(shape, list) and shape and all(isinstance(x, int) for x in shape):
            spare = nbytes - int(np.prod(shape)) * element_size
            if 0 <= spare <= tolerance and (best is None or spare < best[0]):
                best = (spare, tuple(shape))
    return None if best is None else best[1]
