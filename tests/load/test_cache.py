"""GIVEN the cache of parsed traces
WHEN entries are damaged, the cap is reached, traces disappear, or processes load one run at once
THEN nothing damaged is trusted, the cache stays under its cap, and every load gets the same table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import sptrace
from sptrace.cachedir import default_cache_dir, max_bytes
from sptrace.cli import main
from sptrace.load import cache


def write_run(root, ranks=4, events=400):
    root.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        rows = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": 10 + 3 * i,
                 "dur": 2, "args": {"Input Dims": [[r + 1, i]]}} for i in range(events)]  # fmt: skip
        doc = {"traceEvents": rows, "distributedInfo": {"backend": "gloo", "rank": r, "world_size": ranks}}
        (root / f"rank{r}.json").write_text(json.dumps(doc))
    return root


def test_the_suite_writes_no_user_cache(private_cache):
    assert default_cache_dir().is_relative_to(private_cache)


def test_a_damaged_entry_is_rebuilt_never_trusted(tmp_path):
    run = write_run(tmp_path / "run", ranks=1)
    store = tmp_path / "cache"
    first = sptrace.load_trace(run / "rank0.json", cache_dir=store)
    (entry,) = store.glob("*.arrow")
    # flip one byte inside the table's data: still a readable Arrow file, but not the bytes written
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert cache.read_cached(store, run / "rank0.json") is None and not entry.exists()
    again = sptrace.load_trace(run / "rank0.json", cache_dir=store)
    assert again.table.equals(first.table)
    # half an entry (a truncated file) is a miss too
    (entry,) = store.glob("*.arrow")
    entry.write_bytes(entry.read_bytes()[:100])
    assert cache.read_cached(store, run / "rank0.json") is None
    assert sptrace.load_trace(run / "rank0.json", cache_dir=store).table.equals(first.table)


def test_least_recently_used_entries_go_past_the_cap(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", ranks=3)
    store = tmp_path / "cache"
    sptrace.load_trace(run / "rank0.json", cache_dir=store)
    one = sum(p.stat().st_size for p in store.glob("*.arrow"))
    monkeypatch.setenv("SPTRACE_CACHE_MAX", str(int(2.5 * one)))  # room for two entries
    sptrace.load_trace(run / "rank1.json", cache_dir=store)
    os.utime(next(e.path for e in cache.entries(store) if e.source.endswith("rank0.json")), (1, 1))  # oldest use
    sptrace.load_trace(run / "rank2.json", cache_dir=store)
    kept = sorted(os.path.basename(e.source) for e in cache.entries(store))
    assert kept == ["rank1.json", "rank2.json"]
    assert sum(e.bytes for e in cache.entries(store)) <= 2.5 * one


def test_entries_of_traces_that_are_gone_are_dropped(tmp_path, capsys):
    run = write_run(tmp_path / "run", ranks=2)
    store = tmp_path / "cache"
    sptrace.load_run(run, cache_dir=store)
    (run / "rank1.json").unlink()
    assert main(["cache", "info", "--cache-dir", str(store)]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "1 entries parsed from traces that are gone" in out
    sptrace.load_trace(tmp_path / "run" / "rank0.json", cache_dir=store, rank=0)  # a hit: nothing written
    write_run(tmp_path / "other", ranks=1)
    sptrace.load_trace(tmp_path / "other" / "rank0.json", cache_dir=store)  # a write prunes
    sources = sorted(e.source for e in cache.entries(store))
    assert sources == sorted([str((run / "rank0.json").resolve()), str((tmp_path / "other/rank0.json").resolve())])
    assert main(["cache", "info", "--cache-dir", str(store), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 2 and info["max_bytes"] == 2 * 2**30 and info["source_gone"] == 0
    assert main(["cache", "clear", "--cache-dir", str(store)]) == 0
    assert "cleared" in capsys.readouterr().out and not list(store.glob("*.arrow"))


@pytest.mark.parametrize("value, expected", [("", 2 * 2**30), ("500M", 500 * 2**20), ("4G", 4 * 2**30), ("1234", 1234)])
def test_cache_cap_setting(monkeypatch, value, expected):
    monkeypatch.setenv("SPTRACE_CACHE_MAX", value)
    assert max_bytes() == expected


def test_a_bad_cap_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPTRACE_CACHE_MAX", "lots")
    assert main(["cache", "info", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SPTRACE_CACHE_MAX='lots'" in err


def test_processes_loading_one_run_at_once_share_the_cache(tmp_path):
    # GIVEN four processes that load the same run, with the same cache, at the same moment
    run = write_run(tmp_path / "run", ranks=4, events=3000)
    store = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import sys, time, hashlib, sptrace
        while time.time() < {__import__("time").time() + 3}:  # start together
            time.sleep(0.005)
        for _ in range(3):
            run = sptrace.load_run({str(run)!r}, cache_dir={str(store)!r}, workers=1)
        digest = hashlib.sha1()
        for t in run:
            digest.update(str(t.rank).encode() + t.table.to_pandas().to_csv().encode())
        print(digest.hexdigest())
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    # THEN every process succeeds with the same tables, and the cache holds one whole entry per rank
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1
    entries = cache.entries(store)
    assert len(entries) == 4 and not list(store.glob(".tmp-*"))
    for r in range(4):
        assert cache.read_cached(store, run / f"rank{r}.json") is not None
