"""A W-rank run replicated into an N-rank one: copies of a real job, for scale tests and
benchmarks (``benchmarks/bench_scale.py``, the dashboard's many-rank views).

Copy c of rank r becomes rank c*W + r: its ``distributedInfo`` gets the new rank and world
size, and every process group named in the trace (``Process Group Ranks``, ``pg_config``) moves
to the copy's ranks under a name of its own, so an N-rank run holds N/W jobs' worth of groups,
as a large job's TP or SP groups are. Timestamps are kept: the copies ran at the same time.
Files are written with the standard library's separators (", ", ": "): HTA finds a trace's rank
by a text search that expects them.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

from sptrace.load.files import RUN_FILE, find_traces
from sptrace.load.trace import DistributedInfo, is_json_count
from sptrace.vocab.errors import TraceError, UsageError


class TraceDocument(TypedDict, total=False):
    """A trace file's JSON, of which replication rewrites these keys (the rest are copied as they are)."""

    traceEvents: list[Mapping[str, object]]
    distributedInfo: DistributedInfo


def read_document(path: Path) -> TraceDocument:
    import msgspec

    raw = gzip.open(path).read() if path.name.endswith(".gz") else path.read_bytes()
    return cast(TraceDocument, msgspec.json.decode(raw))  # the JSON edge: checked by the caller


RANK_KEYS = ("Process Group Ranks", "ranks")
NAME_KEYS = ("Process Group Name", "pg_name")


def move_groups(value: object, offset: int, copy: int) -> object:
    """Every process group of the trace (in any JSON value: groups are named at any depth), moved
    to copy ``copy``'s ranks under its own name."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in RANK_KEYS and isinstance(v, (str, list)):
                ranks = json.loads(v) if isinstance(v, str) else v
                if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
                    moved = [r + offset for r in ranks]
                    out[k] = json.dumps(moved) if isinstance(v, str) else moved
                    continue
            if k in NAME_KEYS and isinstance(v, str):
                out[k] = f"{v}:{copy}" if copy else v
                continue
            out[k] = move_groups(v, offset, copy)
        return out
    if isinstance(value, list):
        return [move_groups(v, offset, copy) for v in value]
    return value


def replicate_run(source: Path, n: int, out: Path) -> Path:
    """An n-rank run in ``out`` (created) from the source run's W rank traces (n a multiple of W)."""
    files, _ = find_traces(Path(source))
    traces = {}
    for f in files:
        t = read_document(f)
        info = t.get("distributedInfo") if isinstance(t, dict) else None
        if not isinstance(info, dict) or not is_json_count(info.get("rank")):
            raise TraceError(f, "no distributedInfo rank: cannot tell which rank to replicate")
        traces[info["rank"]] = t
    world = len(traces)
    if n % world:
        raise UsageError(f"{n} ranks is not a multiple of the source's {world}")
    out.mkdir(parents=True)
    if (Path(source) / RUN_FILE).is_file():  # the declared model: the same job, n/world times over
        shutil.copy(Path(source) / RUN_FILE, out / RUN_FILE)
    for copy in range(n // world):
        offset = copy * world
        for rank, trace in traces.items():
            t = dict(trace)
            info = {**trace["distributedInfo"], "rank": rank + offset, "world_size": n}
            t["distributedInfo"] = move_groups(info, offset, copy)
            if copy:
                t["traceEvents"] = [
                    {**e, "args": move_groups(e["args"], offset, copy)} if "args" in e else e
                    for e in trace["traceEvents"]
                ]
            (out / f"rank{rank + offset}.json").write_text(json.dumps(t))
    return out
