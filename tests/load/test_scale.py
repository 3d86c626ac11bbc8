"""GIVEN runs of many ranks: the synthetic generator's (benchmarks/synth_run.py: a small NCCL run
replicated with clock offsets, arrival jitter and planted stragglers), and the stores the reduce
gathers the ranks' results in (sptrace.run.spool, sptrace.run.gather)
WHEN the run is synthesized, and analysed with the stores spilled to disk or held in memory
THEN the generator plants what it records (offsets, one straggler per 1000 ranks, one job waiting
at the anchor collective), the critical path names the planted straggler, the spilled reduce
prints what the held one prints, the stores give back what was put in, and the map's progress is
a line per 10% off a terminal past 64 ranks."""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
from pathlib import Path

import pandas as pd
import pytest

from sptrace.cli import main
from sptrace.run import executors, spool
from sptrace.run.gather import share_equal
from sptrace.run.spool import FrameChunks, SpooledRanks
from tests.trace_helpers import write_gpu_run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from synth_run import Plan, names_groups, read_planted, synthesize


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank NCCL run whose collectives are on the default group, named nowhere (as the corpus
    DLRM run's are): its copies make one job of N ranks."""
    run = write_gpu_run(tmp_path_factory.mktemp("source") / "run")
    for f in run.glob("rank*.json"):
        doc = json.loads(f.read_text())
        doc["distributedInfo"].pop("pg_config", None)
        for e in doc["traceEvents"]:
            for key in ("Process Group Name", "Process Group Ranks", "Process Group Description"):
                e.get("args", {}).pop(key, None)
        f.write_text(json.dumps(doc))
    return run


def _kernel_ends(events: list[dict], offset: float) -> list[float]:
    return [e["ts"] + e["dur"] - offset for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]


def test_the_generator_plants_what_it_records(source: Path, tmp_path: Path) -> None:
    planted = synthesize(source, 2000, tmp_path / "run", Plan(seed=3))
    assert read_planted(tmp_path / "run").stragglers == planted.stragglers
    assert len(list((tmp_path / "run").glob("rank*.json"))) == 2000
    assert len(planted.stragglers) == 2 and sorted(r // 1000 for r in planted.stragglers) == [0, 1]
    assert planted.stragglers[planted.slowest] == max(planted.stragglers.values())
    original = json.loads((source / "rank0.json").read_text())
    first = min(e["ts"] for e in original["traceEvents"] if "ts" in e)
    for rank in (0, 2, 1998, *planted.stragglers):
        doc = json.loads((tmp_path / "run" / f"rank{rank}.json").read_text())
        assert doc["distributedInfo"]["rank"] == rank and doc["distributedInfo"]["world_size"] == 2000
        if rank % 2 == 0:  # before the anchor every event only moved by the rank's clock offset
            got = min(e["ts"] for e in doc["traceEvents"] if "ts" in e)
            assert got - first == pytest.approx(planted.offsets_us[rank], abs=1)
    # the anchor collective (each rank's middle NCCL kernel) waits for its job's last arrival: once
    # the clock offsets are taken out, every member's ends that much later than in the source
    sources = [json.loads((source / f"rank{r}.json").read_text())["traceEvents"] for r in (0, 1)]
    jobs: dict[int, list[float]] = {}
    for rank in (*planted.stragglers, 0, 1, 1000, 1001):
        doc = json.loads((tmp_path / "run" / f"rank{rank}.json").read_text())
        ends, was = (
            sorted(_kernel_ends(doc["traceEvents"], planted.offsets_us[rank])),
            sorted(_kernel_ends(sources[rank % 2], 0.0)),
        )
        later = ends[len(ends) // 2] - was[len(was) // 2]
        jobs.setdefault(rank // 2 if names_groups(original) else 0, []).append(later)
    for later in jobs.values():
        assert max(later) - min(later) <= 2
    assert max(max(v) for v in jobs.values()) >= planted.stragglers[planted.slowest]


@pytest.mark.parametrize("late_us", [4_000.0, 8_000.0])
def test_the_critical_path_names_the_planted_straggler(corpus: Path, tmp_path: Path, capsys, late_us) -> None:
    """On the corpus DLRM run (8 real NCCL ranks) made 64: the straggler's late arrival holds every
    rank at its all-reduce, and the path walks back to it through the clock offsets. 8 ms late,
    the all-reduce ends after every rank's CPU step has (the GPUs wait, the CPUs ran on): the
    step lasts until the collectives it called end, so the path still runs through the wait."""
    run = tmp_path / "run"
    planted = synthesize(corpus / "param_dlrm_kineto", 64, run, Plan(straggler_us=late_us, seed=1))
    assert main(["analyze", str(run), "--no-cache", "--format", "json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    culprit = out["critical_path"]["culprit"]
    assert culprit["rank"] == planted.slowest == next(iter(planted.stragglers))
    assert late_us <= culprit["dur_us"] < late_us + 200 and culprit["waiting"] == 63
    offsets = {int(r): v for r, v in out["clock_offsets_us"].items()}
    # the offsets matching estimates are the planted ones, up to one rank's (its reference)
    rel = {r: offsets[r] - offsets[0] for r in offsets}
    truth = {r: planted.offsets_us[r] - planted.offsets_us[0] for r in offsets}
    assert max(abs(rel[r] - truth[r]) for r in offsets) < 200  # (of offsets drawn in +-20 ms)


def test_the_spilled_reduce_prints_what_the_held_one_prints(source: Path, tmp_path: Path, capsys, monkeypatch):
    run = tmp_path / "run"
    synthesize(source, 80, run)
    printed = []
    for spill_past, chunk in ((10**9, 10**9), (0, 1), (spool.SPILL_PAST_RANKS, spool.CHUNK_FRAMES)):
        monkeypatch.setattr(spool, "SPILL_PAST_RANKS", spill_past)
        monkeypatch.setattr(spool, "CHUNK_FRAMES", chunk)
        for command in ("analyze", "collectives"):
            main([command, str(run), "--no-cache", "--format", "json"])
            printed.append(capsys.readouterr().out)
        merged = tmp_path / "merged.json"
        assert main(["export", str(run), "--no-cache", "-o", str(merged)]) == 0
        printed.append(merged.read_text())
    assert len(printed) == 9 and printed[0:3] == printed[3:6] == printed[6:9]
    assert json.loads(printed[0])["critical_path"] is not None


def test_a_spooled_store_moves_to_an_unlinked_file_past_its_limit() -> None:
    store: SpooledRanks[pd.DataFrame] = SpooledRanks(spill_past=2)
    frames = {r: pd.DataFrame({"rank": [r] * 3, "x": [0.5, 1.5, 2.5], "s": ["a", None, "b"]}) for r in range(5)}
    for r in (3, 0):
        store.put(r, frames[r])
    assert not store.spilled and set(store) == {0, 3}
    for r in (1, 2, 4):
        store.put(r, frames[r])
    assert store.spilled and len(store) == 5 and 4 in store and 7 not in store
    for r, f in frames.items():
        pd.testing.assert_frame_equal(store[r], f)
    assert store._file is not None and os.fstat(store._file.fileno()).st_nlink == 0  # no name on disk
    again = pickle.loads(pickle.dumps(store))
    assert not again.spilled and sorted(again) == [0, 1, 2, 3, 4]
    pd.testing.assert_frame_equal(again[2], frames[2])
    store.put(5, frames[0].assign(rank=5))  # a write after reads goes to the file's end, not over a value
    store.put(6, frames[1].assign(rank=6))
    for r in range(7):
        assert store[r]["rank"].tolist() == [r] * 3


def test_frame_chunks_join_in_order_with_their_strings_back() -> None:
    chunks = FrameChunks(["rank", "name", "v"], chunk_frames=2)
    parts = [pd.DataFrame({"rank": [r, r], "name": [f"n{r}", None], "v": [r * 1.0, 2.0], "t": [(r,), (1,)]})
             for r in range(5)]  # fmt: skip
    for p in parts:
        chunks.append(p)
    chunks.append(None)
    chunks.append(parts[0].iloc[:0])
    got = chunks.frame()
    want = pd.concat(parts, ignore_index=True)
    want["name"] = want["name"].astype(object).where(want["name"].notna(), None)  # (concat may make one NaN)
    assert got["name"].dtype == object and got["name"].tolist() == want["name"].tolist()
    assert got["name"].isna().sum() == 5 and all(v is None for v in got["name"] if not isinstance(v, str))
    pd.testing.assert_frame_equal(got, want)
    assert list(FrameChunks(["a", "b"]).frame().columns) == ["a", "b"]


def test_equal_metadata_is_held_once() -> None:
    shared: dict[bytes, object] = {}
    a = share_equal({"rank": 0, "deviceProperties": [{"name": "H200", "sm": 132}]}, shared)
    b = share_equal({"rank": 1, "deviceProperties": [{"name": "H200", "sm": 132}]}, shared)
    assert a["deviceProperties"] is b["deviceProperties"] and a is not b and b["rank"] == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_line_per_tenth_off_a_terminal_past_64_ranks(monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(executors._progress(64, None, "x"), executors._NoBar)
    assert isinstance(executors._progress(65, False, "x"), executors._NoBar)
    lines = io.StringIO()
    bar = executors.TenthLines(200, "analysing ranks", stream=lines)
    for _ in range(200):
        bar.update(1)
    said = lines.getvalue().splitlines()
    assert len(said) == 10 and said[0].startswith("analysing ranks: 10% (20 of 200 ranks")
    assert said[-1].startswith("analysing ranks: 100% (200 of 200 ranks")
    assert isinstance(executors._progress(65, None, "x"), executors.TenthLines)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert type(executors._progress(8, None, "x")).__name__ == "tqdm"
