"""Windows of events from the run store: the per-rank Arrow cache, queried in place.

A view that drills down (the events around one collective on a rank, a phase on a group of
ranks) reads only that window. Each rank's cached table is an Arrow IPC file; pyarrow.dataset
memory-maps the files and scans them with the window's predicate, so only the rows in the
window are materialized and no run is loaded whole. ``benchmarks/bench_store.py`` measured the
engines on 64 DLRM ranks (docs/facts.md): pyarrow.dataset and a plain memory map with Arrow's
filter (``engine="mmap"``) are within 30% of each other, the dataset ahead as the window spans
more ranks; DuckDB reads Arrow IPC only through pyarrow here (its own IPC reader is an
extension it would download) and was 3.6-17x slower, so it is not a dependency.

A rank whose trace was read with the cache off has no entry: its file is parsed again and
filtered in memory (slower, same rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.ipc as ipc

from sptrace.cachedir import default_cache_dir
from sptrace.load import cache as table_cache
from sptrace.load.trace import RunTrace, load_trace

WINDOW_COLUMNS = ["name", "cat", "ph", "ts_ns", "dur_ns", "tid", "input_dims", "input_types", "external_id"]
"""What a drill-down shows by default (every column of sptrace.load.schema is available)."""
ENGINES = ("dataset", "mmap")


def window_filter(start_ns: int | None, end_ns: int | None) -> ds.Expression | None:
    """Events that overlap [start_ns, end_ns): they start before its end and end after its start."""
    parts = []
    if end_ns is not None:
        parts.append(ds.field("ts_ns") < end_ns)
    if start_ns is not None:
        end = pc.add(ds.field("ts_ns"), pc.coalesce(ds.field("dur_ns"), pa.scalar(0, pa.int64())))
        parts.append(end >= start_ns)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0] & parts[1]


def event_window(
    run: RunTrace,
    ranks: Iterable[int] | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    *,
    columns: list[str] | None = None,
    cache_dir: Path | None = None,
    engine: str = "dataset",
) -> pa.Table:
    """The events of ``ranks`` (default: all) that overlap [start_ns, end_ns) on each rank's own
    clock, with a ``rank`` column first, sorted by rank and time. ``engine``: dataset
    (pyarrow.dataset) or mmap (each file memory-mapped and filtered), for bench_store.py."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}")
    wanted = list(run.ranks) if ranks is None else [r for r in ranks if r in run.ranks]
    cols = list(columns or WINDOW_COLUMNS)
    predicate = window_filter(start_ns, end_ns)
    entries: dict[str, int] = {}
    parts: list[pa.Table] = []
    for rank in wanted:
        trace = run.ranks[rank]
        use_cache, directory = trace.reload
        directory = cache_dir or directory or default_cache_dir()
        entry = table_cache.cached_entry(directory, trace.path) if use_cache else None
        if entry is not None and engine == "dataset":
            entries[str(entry)] = rank
            continue
        if entry is not None:
            with pa.memory_map(str(entry), "r") as source:
                table = ipc.open_file(source).read_all()
        else:
            table = trace.loaded if trace.loaded is not None else load_trace(trace.path, cache=False).table
        if predicate is not None:
            table = table.filter(predicate)
        parts.append(_with_rank(table.select(cols), rank))
    if entries:
        dataset = ds.dataset(list(entries), format="ipc")
        for fragment in dataset.get_fragments():
            table = fragment.to_table(columns=cols, filter=predicate)
            parts.append(_with_rank(table, entries[fragment.path]))
    if not parts:
        return _with_rank(pa.table({c: pa.array([], type=_type(c)) for c in cols}), 0)
    out = pa.concat_tables([t.replace_schema_metadata(None) for t in parts], promote_options="permissive")
    return out.sort_by([("rank", "ascending"), ("ts_ns", "ascending")]) if "ts_ns" in cols else out


def _with_rank(table: pa.Table, rank: int) -> pa.Table:
    return table.add_column(0, "rank", pa.array([rank] * table.num_rows, type=pa.int64()))


def _type(column: str) -> pa.DataType:
    from sptrace.load.schema import SCHEMA

    return SCHEMA.field(column).type
