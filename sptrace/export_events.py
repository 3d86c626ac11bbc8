"""The events a rank's profiler recorded, as a merged trace writes them (sptrace.export): read from
the rank's event table (sptrace.load.schema) one batch at a time, so that a rank of millions of
events never becomes millions of Python objects at once.

What is kept: complete events (X), instants (i, I), counters (C) and flows (s, t, f), each with
a timestamp; metadata (M) is written anew, the rank being one process. ``args`` are rebuilt from
the table's ARG_COLUMNS, each under its first source key ("External id", "Input Dims", ...): the
args sptrace does not read were never kept. Flow ids are renumbered (each rank's own flows count
from 1, and two ranks' ids would join into one flow) and, in a window, a flow whose start or end
the window leaves out is dropped with its partner.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from sptrace.export_tracks import OWN_TID, Window
from sptrace.load.arrow import to_numpy
from sptrace.load.schema import ARG_COLUMNS
from sptrace.load.window import window_filter
from sptrace.vocab import markers
from sptrace.vocab.jsontypes import JSONObject

KEPT = ("X", "i", "I", "C", "s", "t", "f")
FLOWS = ("s", "t", "f")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
BATCH = 32768
"""Rows turned into events at a time."""
_ARGS = [(column, keys[0]) for column, _, keys in ARG_COLUMNS if column != "meta"]
_JSON_TEXT = frozenset({"input_dims", "input_types", "concrete_inputs", "in_split", "out_split", "pg_ranks"})
"""Args the table keeps as JSON text (nested lists): written as the lists they were."""


def kept_rows(table: pa.Table, window: Window) -> pa.Table:
    """The rows a merged trace writes: kept phases with a timestamp (flows with an id),
    overlapping ``window`` (on the rank's own clock), and in a window flows only with both ends."""
    flow = ds.field("ph").isin(list(FLOWS))
    rows = table.filter(ds.field("ph").isin(list(KEPT)) & ds.field("ts_ns").is_valid()
                        & (~flow | ds.field("flow_id").is_valid()))  # fmt: skip
    overlap = window_filter(*window)
    if overlap is None:
        return rows
    return _whole_flows(rows.filter(overlap))


def _whole_flows(rows: pa.Table) -> pa.Table:
    """``rows`` less the flow events whose id has no start or no end among them."""
    ph = _texts(rows.column("ph"))
    ids = to_numpy(rows.column("flow_id"), fill=-1)
    flow = np.isin(ph, FLOWS)
    if not flow.any():
        return rows
    starts, ends = ids[flow & (ph == "s")], ids[flow & (ph == "f")]
    whole = np.isin(ids, starts) & np.isin(ids, ends)
    return rows.filter(pa.array(~flow | whole))


def _texts(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A string (or dictionary) column as a numpy array of str, '' for null."""
    return np.array([v or "" for v in _values(column)], dtype=object)


def _values(column: pa.ChunkedArray | pa.Array) -> list:
    """A column's values as Python objects; a dictionary column's distinct values made once each
    (to_pylist makes one string per row)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list = []
    for chunk in chunks:
        if isinstance(chunk, pa.DictionaryArray):
            lut = np.array([*chunk.dictionary.to_pylist(), None], dtype=object)
            out += lut[to_numpy(chunk.indices, fill=-1)].tolist()
        else:
            out += chunk.to_pylist()
    return out


@dataclass(frozen=True)
class Threads:
    """A rank's recorded threads and streams: each (pid, tid) of its trace -> (tid, name) in the
    merged trace, where the rank is one process. A tid two of the trace's processes share (a
    CPU thread and a stream, say) is kept by the first; the other gets one below OWN_TID."""

    tracks: dict[tuple[int, int], tuple[int, str]]

    @classmethod
    def of(cls, rows: pa.Table) -> Threads:
        if not rows.num_rows:
            return cls({})
        pid, tid = to_numpy(rows.column("pid"), fill=-1), to_numpy(rows.column("tid"), fill=0)
        pairs, first, which = np.unique(np.stack([pid, tid], axis=1), axis=0, return_index=True, return_inverse=True)
        gpu_rows = np.isin(_texts(rows.column("raw_cat")), GPU_CATS) | np.isin(_texts(rows.column("cat")), GPU_CATS)
        gpu = np.bincount(which.ravel(), weights=gpu_rows, minlength=len(pairs)) > 0
        names = _values(rows.column("thread_name").take(pa.array(first)))
        tracks: dict[tuple[int, int], tuple[int, str]] = {}
        taken: set[int] = set()
        for (p, t), on_gpu, name in zip(pairs.tolist(), gpu.tolist(), names):
            out = t if t not in taken else OWN_TID - 1 - len(taken)
            taken.add(out)
            name = name.strip() if isinstance(name, str) else ""
            tracks[(p, t)] = (out, name or f"{'stream' if on_gpu else 'thread'} {t}")
        return cls(tracks)

    def metadata(self, rank: int) -> list[JSONObject]:
        return [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}}
                for tid, name in sorted(self.tracks.values())]  # fmt: skip


def flow_numbers(rows: pa.Table) -> np.ndarray:
    """The distinct flow ids of a rank's rows, sorted: a flow's new id is its place here."""
    ph = _texts(rows.column("ph"))
    ids = to_numpy(rows.column("flow_id"), fill=-1)
    return np.unique(ids[np.isin(ph, FLOWS) & (ids >= 0)])


def event_batches(rows: pa.Table, rank: int, shift_ns: int, threads: Threads, flows: np.ndarray,
                  first_flow: int) -> Iterator[list[JSONObject]]:  # fmt: skip
    """The rows as trace events of process ``rank``, a batch at a time: ts = the row's ts less
    ``shift_ns`` (its clock offset and the file's zero), in us; flow ids renumbered from
    ``first_flow`` in the order of ``flows`` (flow_numbers)."""
    texts: dict[str, object] = {}  # each JSON text parsed once
    for batch in rows.to_batches(max_chunksize=BATCH):
        yield _events(batch, rank, shift_ns, threads, flows, first_flow, texts)


def _events(batch: pa.RecordBatch, rank: int, shift_ns: int, threads: Threads, flows: np.ndarray, first_flow: int,
            texts: dict[str, object]) -> list[JSONObject]:  # fmt: skip
    n = batch.num_rows
    names = _values(batch.column("name"))
    cats = _values(batch.column("raw_cat"))
    phs = _values(batch.column("ph"))
    ts = ((to_numpy(batch.column("ts_ns")) - shift_ns) / 1e3).tolist()
    dur = (to_numpy(batch.column("dur_ns"), fill=0) / 1e3).tolist()
    pids = to_numpy(batch.column("pid"), fill=-1).tolist()
    tids = to_numpy(batch.column("tid"), fill=0).tolist()
    ids = to_numpy(batch.column("flow_id"), fill=-1)
    new_ids = (first_flow + np.searchsorted(flows, ids)).tolist()
    bps = _values(batch.column("flow_bp"))
    args = _batch_args(batch, texts)
    tracks = threads.tracks
    out: list[JSONObject] = []
    for i in range(n):
        ph = phs[i]
        e: JSONObject = {"ph": ph, "name": names[i] or "", "pid": rank, "tid": tracks[(pids[i], tids[i])][0],
                         "ts": ts[i]}  # fmt: skip
        if cats[i] is not None:
            e["cat"] = cats[i]
        if ph == "X":
            e["dur"] = dur[i]
        elif ph in FLOWS:
            e["id"] = new_ids[i]
            if bps[i]:
                e["bp"] = bps[i]
        elif ph in ("i", "I"):
            e["s"] = "t"
        if args[i] is not None:
            e["args"] = args[i]
        elif ph == "C":
            e["args"] = {}
        out.append(e)
    return out


def _batch_args(batch: pa.RecordBatch, texts: dict[str, object]) -> list[JSONObject | None]:
    """Each row's args from the ARG_COLUMNS it has a value in (None: none)."""
    args: list[JSONObject | None] = [None] * batch.num_rows
    for column, key in _ARGS:
        arr = batch.column(column)
        if arr.null_count == len(arr):
            continue
        rows = np.flatnonzero(to_numpy(arr.is_valid())) if arr.null_count else range(len(arr))
        values = _values(arr.take(pa.array(rows)) if arr.null_count else arr)
        if column in _JSON_TEXT:
            values = [_json_text(v, texts) for v in values]
        for i, v in zip(rows, values):
            row = args[i]
            if row is None:
                args[i] = {key: v}
            else:
                row[key] = v
    return args


def _json_text(text: str, texts: dict[str, object]) -> object:
    """A list or object kept as JSON text, as the value it was; other text as it is."""
    if text[:1] not in ("[", "{"):
        return text
    value = texts.get(text)
    if value is None:
        try:
            value = msgspec.json.decode(text)
        except msgspec.DecodeError:
            value = text
        texts[text] = value
    return value


def module_ranges(table: pa.Table) -> pd.DataFrame:
    """The rank's module ranges on its own clock (columns path, start_ns, end_ns, tid): sptrace's
    module markers (sptrace.module::<path>), else the Python stacks' ``nn.Module: <Class>_<k>``
    frames, named by class (sptrace.detect.timing.detect_module_times reads the same two)."""
    for prefix in (markers.MODULE, "nn.Module: "):
        rows = table.filter(_starts_with(table.column("name"), prefix) & (ds.field("ph") == "X"))
        if rows.num_rows:
            start = to_numpy(rows.column("ts_ns"))
            return pd.DataFrame({
                "path": [n[len(prefix):] or "<root>" for n in rows.column("name").to_pylist()],
                "start_ns": start, "end_ns": start + to_numpy(rows.column("dur_ns"), fill=0),
                "tid": to_numpy(rows.column("tid"), fill=0),
            })  # fmt: skip
    return pd.DataFrame(columns=["path", "start_ns", "end_ns", "tid"])


def _starts_with(column: pa.ChunkedArray, prefix: str) -> ds.Expression:
    """An expression for the rows whose name starts with ``prefix``: the dictionary's matching
    names, found once (a name column holds a few hundred distinct names among 200k rows)."""
    found: set[str] = set()
    for chunk in column.chunks:
        values = chunk.dictionary.to_pylist() if isinstance(chunk, pa.DictionaryArray) else chunk.unique().to_pylist()
        found.update(v for v in values if v is not None and v.startswith(prefix))
    return ds.field("name").isin(sorted(found)) if found else ds.scalar(False)
