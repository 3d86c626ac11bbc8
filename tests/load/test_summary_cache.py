"""GIVEN a run mapped once through the cache (sptrace.run.map: each rank's summary kept beside its
parsed table, sptrace.run.summaries)
WHEN it is mapped again: unchanged, after a trace is touched or edited, with another MapSpec,
with an entry damaged, with the cache off, or with the code changed
THEN an unchanged rank is not summarized again and gives the same result, every change is a
miss that summarizes again, nothing damaged is trusted, and `sptrace cache info` says what the
cache holds, tables and summaries apart."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from sptrace.cli import main
from sptrace.load import cache, load_trace
from sptrace.run import map as rankmap
from sptrace.run import summaries as summary_cache
from sptrace.run.executors import Executor
from sptrace.run.map import MapSpec, map_run
from tests.trace_helpers import gpu_trace, write_gpu_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def counted(monkeypatch):
    """The ranks summarize is called for, in order."""
    calls: list[int | None] = []
    real = rankmap.summarize

    def summarize(trace, spec):
        calls.append(trace.rank)
        return real(trace, spec)

    monkeypatch.setattr(rankmap, "summarize", summarize)
    return calls


def summaries(store: Path) -> list[Path]:
    return sorted(store.glob("*.summary"))


def spec_in(store: Path, **fields) -> MapSpec:
    return MapSpec(("collectives", "sharding"), cache_dir=store, **fields)


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for rank in a:
        pd.testing.assert_frame_equal(a[rank].collectives, b[rank].collectives)
        pd.testing.assert_frame_equal(a[rank].phases, b[rank].phases)
        assert a[rank].timing == b[rank].timing and a[rank].description == b[rank].description


def test_an_unchanged_run_is_not_summarized_again(tmp_path, counted):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    _, first = map_run(run, spec_in(store))
    assert counted == [0, 1] and len(summaries(store)) == 2
    # WHEN the same run is mapped again, even on local workers
    again_run, again = map_run(run, spec_in(store), executor=Executor(workers=2))
    # THEN nothing is summarized (or parsed), and the results are the ones the map made
    assert counted == [0, 1]
    assert_same(first, again)
    assert len(again[0].collectives) == 4 and again[0].timing.step_ms is not None
    # the kept traces are released and read their table back on demand, from the table cache or
    # (its entry gone) from the trace itself
    assert all(t.loaded is None for t in again_run)
    assert again_run.ranks[0].table.equals(load_trace(run / "rank0.json", cache=False).table)
    for entry in store.glob("*.arrow"):
        entry.unlink()
    _, third = map_run(run, spec_in(store))
    assert counted == [0, 1]
    assert third[1].trace.table.equals(load_trace(run / "rank1.json", cache=False).table)


def test_a_warm_run_starts_no_worker(tmp_path, counted, monkeypatch):
    run = write_gpu_run(tmp_path / "run", world=3)
    store = tmp_path / "cache"
    map_run(run, spec_in(store))

    def no_processes(*args, **kwargs):
        raise AssertionError("a worker process was started for a run whose summaries are kept")

    monkeypatch.setattr("sptrace.run.executors._processes", no_processes)
    _, results = map_run(run, spec_in(store), executor=Executor(workers=2))
    assert sorted(results) == [0, 1, 2] and counted == [0, 1, 2]


def test_a_touched_or_edited_trace_is_summarized_again(tmp_path, counted):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    map_run(run, spec_in(store))
    # WHEN rank 1's trace is touched (same bytes, a new mtime)
    st = (run / "rank1.json").stat()
    os.utime(run / "rank1.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, touched = map_run(run, spec_in(store))
    # THEN rank 1 alone is summarized again, and its older summary is gone
    assert counted == [0, 1, 1] and len(summaries(store)) == 2
    # WHEN its contents change: a third step
    (run / "rank1.json").write_text(json.dumps(gpu_trace(1, 2, steps=3)))
    _, edited = map_run(run, spec_in(store))
    assert counted == [0, 1, 1, 1]
    assert len(edited[1].collectives) == 6 and len(touched[1].collectives) == 4


def test_another_spec_is_another_entry(tmp_path, counted):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    map_run(run, spec_in(store))
    map_run(run, spec_in(store, hidden=96))
    map_run(run, MapSpec(("collectives",), cache_dir=store))
    map_run(run, MapSpec((), cache_dir=store))
    assert counted == [0, 1] * 4 and len(summaries(store)) == 8
    # each is kept: none of them is summarized again
    map_run(run, spec_in(store, hidden=96))
    map_run(run, spec_in(store))
    assert len(counted) == 8
    # where the cache lives is no part of the key: the same map in another directory reads none
    map_run(run, spec_in(tmp_path / "elsewhere"))
    assert len(counted) == 10


def test_a_damaged_summary_is_rebuilt_never_trusted(tmp_path, counted):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    _, first = map_run(run, spec_in(store))
    # WHEN one byte of rank 0's summary flips (its CRC no longer matches)
    (entry,) = [e.path for e in cache.entries(store) if e.kind == "summary" and e.source.endswith("rank0.json")]
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    _, again = map_run(run, spec_in(store))
    # THEN it is a miss: rank 0 is summarized again, into a whole entry
    assert counted == [0, 1, 0]
    assert_same(first, again)
    assert len(summaries(store)) == 2 and cache.read_summary(store, *key_of(run / "rank0.json", store)) is not None
    # half an entry is a miss too
    (entry,) = [e.path for e in cache.entries(store) if e.kind == "summary" and e.source.endswith("rank0.json")]
    entry.write_bytes(entry.read_bytes()[:40])
    map_run(run, spec_in(store))
    assert counted == [0, 1, 0, 0]
    # and so is a whole entry whose payload does not unpickle (written by code that is gone)
    version, key = key_of(run / "rank1.json", store)
    for e in summaries(store):
        if e.name.startswith(version):
            e.unlink()
    bad = cache.write_summary(store, version, key, {"source": str(run / "rank1.json")}, b"not a pickle")
    assert bad is not None and summary_cache.read_summary(slot_of(run / "rank1.json", store), object) is None
    assert not bad.exists()
    # or unpickles into something that is not a rank's summary
    wrong = cache.write_summary(store, version, key, {"source": str(run / "rank1.json")}, pickle.dumps({"rank": 1}))
    assert wrong is not None and rankmap.read_result(slot_of(run / "rank1.json", store)) is None
    assert not wrong.exists()
    _, last = map_run(run, spec_in(store))
    assert counted == [0, 1, 0, 0, 1]
    assert_same(first, last)


def slot_of(path: Path, store: Path) -> summary_cache.Slot:
    slot = rankmap.summary_slot(path, spec_in(store))
    assert slot is not None
    return slot


def key_of(path: Path, store: Path) -> tuple[str, str]:
    slot = slot_of(path, store)
    return slot.version, slot.key


def test_other_code_is_a_miss(tmp_path, counted, monkeypatch):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    map_run(run, spec_in(store))
    monkeypatch.setattr(summary_cache, "code_digest", lambda: "another sptrace")
    map_run(run, spec_in(store))
    assert counted == [0, 1, 0, 1]
    # both generations are kept (two installs may share a cache), the other one's marked as such
    kinds = [summary_cache.is_current(e) for e in cache.entries(store) if e.kind == "summary"]
    assert sorted(kinds) == [False, False, True, True]
    # no sources to digest: no summary is kept or read
    monkeypatch.setattr(summary_cache, "code_digest", lambda: None)
    map_run(run, spec_in(store))
    assert counted == [0, 1, 0, 1, 0, 1]


def test_no_cache_bypasses_the_summaries(tmp_path, counted, capsys):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    map_run(run, spec_in(store))
    map_run(run, spec_in(store, cache=False))
    map_run(run, spec_in(tmp_path / "unused", cache=False))
    assert counted == [0, 1] * 3 and not (tmp_path / "unused").exists()
    # the CLI's --no-cache: summarized, nothing written
    assert main(["collectives", str(run), "--no-cache", "--cache-dir", str(tmp_path / "unused")]) == 0
    assert counted == [0, 1] * 4 and not (tmp_path / "unused").exists()
    assert "collectives on 2 ranks" in capsys.readouterr().out


def test_summaries_count_in_the_cap(tmp_path, monkeypatch):
    run = write_gpu_run(tmp_path / "run", world=4)
    map_run(run, spec_in(tmp_path / "sizes"))
    tables = sum(e.bytes for e in cache.entries(tmp_path / "sizes") if e.kind == "table")
    summaries_bytes = sum(e.bytes for e in cache.entries(tmp_path / "sizes") if e.kind == "summary")
    assert summaries_bytes > 0
    # WHEN the cap holds the tables alone
    monkeypatch.setenv("SPTRACE_CACHE_MAX", str(tables))
    store = tmp_path / "cache"
    map_run(run, spec_in(store))
    # THEN least recently used entries went to make room for the summaries
    kept = cache.entries(store)
    assert sum(e.bytes for e in kept) <= tables and {e.kind for e in kept} == {"table", "summary"}
    assert len(kept) < 8


def test_cache_info_says_what_is_cached(tmp_path, capsys):
    run = write_gpu_run(tmp_path / "run")
    store = tmp_path / "cache"
    assert main(["collectives", str(run), "--cache-dir", str(store)]) == 0
    assert main(["info", str(run), "--cache-dir", str(store)]) == 0
    capsys.readouterr()
    assert main(["cache", "info", "--cache-dir", str(store), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 6 and info["tables"]["entries"] == 2 and info["summaries"]["entries"] == 4
    assert info["bytes"] == info["tables"]["bytes"] + info["summaries"]["bytes"]
    assert info["summaries"]["other_code"] == 0
    by_kind = {(t["kind"], t.get("about")) for t in info["traces"]}
    assert by_kind == {("table", None), ("summary", "collectives"), ("summary", "description")}
    assert main(["cache", "info", "--cache-dir", str(store)]) == 0
    out = capsys.readouterr().out
    assert "6 entries" in out and "2 parsed tables" in out and "4 summaries" in out
    assert main(["cache", "clear", "--cache-dir", str(store)]) == 0
    assert "cleared" in capsys.readouterr().out and not list(store.iterdir())


def test_the_digest_covers_every_module_a_summary_runs(tmp_path):
    # GIVEN a fresh interpreter that maps a GPU run with [memory] events, every part on
    run = write_gpu_run(tmp_path / "run")
    doc = gpu_trace(0, 2)
    doc["traceEvents"] += [
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 100, "tid": 200, "ts": 5 + i,
         "args": {"Addr": 4096 * (i + 1), "Bytes": 512, "Total Allocated": 512 * (i + 1), "Total Reserved": 2**20,
                  "Device Type": 1, "Device Id": 0}}
        for i in range(4)
    ]  # fmt: skip
    (run / "rank0.json").write_text(json.dumps(doc))
    script = textwrap.dedent(f"""
        import sys
        from sptrace.run.map import MapSpec, map_run
        for parts in [("collectives", "sharding"), ()]:
            _, results = map_run({str(run)!r}, MapSpec(parts, cache=False, element_size=2, hidden=96))
        assert results[0].description["memory_events"] == 4
        print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] == "sptrace")))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    modules = out.stdout.split()
    # THEN every sptrace module it imported is one whose source the summaries' key digests
    assert "sptrace.detect.collectives" in modules and "sptrace.detect.allocations" in modules
    not_summarized = {name.removesuffix(".py") for name in summary_cache.NOT_SUMMARIZED}
    outside = [m for m in modules if "." in m and m.split(".")[1] in not_summarized]
    assert not outside, f"{outside}: imported by a summarize, but left out of the summaries' digest"
