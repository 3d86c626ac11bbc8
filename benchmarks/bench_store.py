"""The run store: reading a window of events from the per-rank Arrow cache, three ways.

    python benchmarks/bench_store.py [--ranks 64] [--source RUN] [--repeats 5]

For an N-rank run (replicated from a real run, as bench_scale.py does) whose tables are in the
cache, each of three windows is read:
  a. one collective's neighbourhood: 1 rank, 2% of the step;
  b. one phase of a rank group: 8 ranks, 30% of the step;
  c. a slice across the whole run: every rank, 1% of the step;
by
  1. ``sptrace.load.window.event_window(..., engine="mmap")``: each rank's IPC file
     memory-mapped and filtered with Arrow's compute;
  2. the same with ``engine="dataset"`` (the default, what the dashboard uses): pyarrow.dataset
     over the files, the predicate pushed into its scan;
  3. DuckDB over a pyarrow dataset of each file (``duckdb`` must be installed; it reads Arrow
     IPC only through pyarrow here, its own reader being an extension it would download);
  4. ``sptrace.load_trace`` of each rank from the cache (entry checked, whole table) and a
     filter: what a viewer without a window reader does.
Median wall time over --repeats, rows returned (all must agree), and ratios to (1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds

from sptrace.load.replicate import replicate_run
from sptrace.load.window import WINDOW_COLUMNS, event_window, window_filter
from sptrace.run.map import MapSpec, map_run

HERE = Path(__file__).resolve().parent
CORPUS = Path(os.environ.get("SPTRACE_CORPUS") or HERE.parent.parent / "shared/corpus")
DLRM = CORPUS / "param_dlrm_kineto"


def duckdb_scan(run, ranks, lo, hi, cache_dir):
    """DuckDB's own scan of the Arrow dataset, the predicate pushed down (rank from the file)."""
    import duckdb

    from sptrace.load import cache as table_cache

    total = 0
    con = duckdb.connect()
    for r in ranks:
        dataset = ds.dataset(str(table_cache.cached_entry(cache_dir, run.ranks[r].path)), format="ipc")
        con.register("events", dataset)
        cols = ", ".join(f'"{c}"' for c in WINDOW_COLUMNS)
        out = con.sql(
            f"SELECT {cols} FROM events WHERE ts_ns < {int(hi)} AND ts_ns + coalesce(dur_ns, 0) >= {int(lo)}"
        ).to_arrow_table()
        total += out.num_rows
    con.close()
    return total


def whole_tables(run, ranks, lo, hi, cache_dir):
    from sptrace.load import load_trace

    total = 0
    for r in ranks:
        table = load_trace(run.ranks[r].path, cache_dir=cache_dir).table
        total += table.filter(window_filter(lo, hi)).select(WINDOW_COLUMNS).num_rows
    return total


def timed(repeats, fn, *args, **kwargs):
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--source", type=Path, help="a run to replicate (default: DLRM from the corpus)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sptrace-bench-store-"))
    try:
        source = args.source or (DLRM if DLRM.is_dir() else None)
        if source is None:
            import subprocess

            source = scratch / "source"
            subprocess.run([sys.executable, "-m", "sptrace", "profile", "--scheme", "megatron", "--out", str(source),
                            "--warmup", "1"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        run_dir = replicate_run(source, args.ranks, scratch / "run")
        cache_dir = scratch / "cache"
        run, _ = map_run(run_dir, MapSpec((), cache_dir=cache_dir))  # fills the store
        starts = [run.ranks[r].time_span_ns() for r in run.ranks]
        lo0 = min(s[0] for s in starts)
        step = max(s[1] for s in starts) - lo0
        ranks = sorted(run.ranks)
        windows = {
            "a. 1 rank, 2% of the step": (ranks[:1], lo0 + step // 2, lo0 + step // 2 + step // 50),
            "b. 8 ranks, 30% of the step": (ranks[8:16], lo0 + step // 5, lo0 + step // 5 + step * 3 // 10),
            f"c. {len(ranks)} ranks, 1% of the step": (ranks, lo0 + step // 3, lo0 + step // 3 + step // 100),
        }
        try:
            import duckdb  # noqa: F401

            have_duckdb = True
        except ImportError:
            have_duckdb = False
            print("duckdb is not installed (pip install duckdb): its column is left out")
        print(f"{len(ranks)} ranks from {source}; {args.repeats} repeats, median wall ms\n")
        print(f"{'window':<30}{'rows':>7}{'mmap':>8}{'dataset':>9}{'x':>6}{'duckdb':>8}{'x':>6}{'load':>8}{'x':>6}")
        for label, (rs, lo, hi) in windows.items():
            t_mm, table = timed(args.repeats, event_window, run, rs, lo, hi, cache_dir=cache_dir, engine="mmap")
            t_ds, by_ds = timed(args.repeats, event_window, run, rs, lo, hi, cache_dir=cache_dir, engine="dataset")
            t_all, rows_all = timed(args.repeats, whole_tables, run, rs, lo, hi, cache_dir)
            assert rows_all == table.num_rows == by_ds.num_rows, (rows_all, table.num_rows, by_ds.num_rows)
            duck = f"{'-':>8}{'':>6}"
            if have_duckdb:
                t_duck, rows_duck = timed(args.repeats, duckdb_scan, run, rs, lo, hi, cache_dir)
                assert rows_duck == table.num_rows, (rows_duck, table.num_rows)
                duck = f"{t_duck * 1e3:>8.1f}{t_duck / t_mm:>6.1f}"
            print(f"{label:<30}{table.num_rows:>7}{t_mm * 1e3:>8.1f}{t_ds * 1e3:>9.1f}{t_ds / t_mm:>6.1f}{duck}"
                  f"{t_all * 1e3:>8.1f}{t_all / t_mm:>6.1f}")  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
