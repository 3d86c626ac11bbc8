"""GIVEN broken, truncated, foreign or inconsistent traces
WHEN they are loaded (API) or shown (sptrace info)
THEN a typed TraceError / exit code 2 with one line naming the file and the problem; never a
traceback, never a half-built result."""

from __future__ import annotations

import gzip
import json
import warnings

import pytest

import sptrace
from sptrace.cli import main
from sptrace.vocab.errors import TraceError


def trace_json(rank=None, world=None, n=3, **extra):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 + i, "dur": 1} for i in range(n)
    ]
    doc = {"schemaVersion": 1, "traceEvents": events, **extra}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    return json.dumps(doc)


GOOD = trace_json()


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("empty.json", b"", "empty file"),
        ("trunc.json.gz", gzip.compress(GOOD.encode() * 50)[:200], "truncated gzip stream: the file is incomplete"),
        ("trunc.json", GOOD[: len(GOOD) // 2].encode(), "invalid JSON: truncated after"),
        ("comma.json", b'{"traceEvents": [{"ph": "X", "ts": 1,}]}', "invalid JSON: JSON is malformed"),
        ("other.json", b'{"results": [1, 2]}', "no traceEvents: not a Kineto/Chrome trace"),
        ("list.json", b"[1, 2, 3]", "not a Kineto trace: the JSON is not an object with traceEvents"),
        ("nots.json", b'{"traceEvents": [{"ph": "X", "name": "a"}, {"ph": "X", "name": "b"}]}', "2 events have no ts"),
        ("notgz.json.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 40, "corrupt gzip data"),
    ],
)
def test_bad_files(tmp_path, capsys, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError) as err:
        sptrace.load_trace(path, cache=False)
    assert err.value.path == path and problem in err.value.problem
    assert main(["info", str(path), "--no-cache"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith(f"sptrace: error: {path}: ") and problem in out.err


def write(dirpath, name, text):
    dirpath.mkdir(exist_ok=True)
    (dirpath / name).write_text(text)


def test_directory_without_traces(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(TraceError, match="no trace files"):
        sptrace.load_run(tmp_path, cache=False)
    assert main(["info", str(tmp_path)]) == 2
    assert "no trace files (*.json, *.json.gz) in this directory" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_two_files_claiming_one_rank(tmp_path):
    write(tmp_path, "a.json", trace_json(rank=1, world=2))
    write(tmp_path, "b.json", trace_json(rank=1, world=2))
    with pytest.raises(TraceError, match=r"b.json: claims rank 1, as does .*a.json"):
        sptrace.load_run(tmp_path, cache=False)


def test_ranks_from_different_worlds(tmp_path):
    write(tmp_path, "rank0.json", trace_json(rank=0, world=2))
    write(tmp_path, "rank1.json", trace_json(rank=1, world=4))
    with pytest.raises(
        TraceError, match=r"ranks come from different runs: world sizes differ \(rank0.json: 2, rank1.json: 4\)"
    ):
        sptrace.load_run(tmp_path, cache=False)


def test_ranks_from_different_backends(tmp_path):
    write(tmp_path, "rank0.json", trace_json(rank=0, world=2))
    doc = json.loads(trace_json(rank=1, world=2))
    doc["distributedInfo"]["backend"] = "gloo"
    write(tmp_path, "rank1.json", json.dumps(doc))
    with pytest.raises(TraceError, match=r"different runs: backends \['gloo', 'nccl'\]"):
        sptrace.load_run(tmp_path, cache=False)


def test_missing_rank_warns_and_says_what_is_incomplete(tmp_path, capsys):
    for r in (0, 1, 3):
        write(tmp_path, f"rank{r}.json", trace_json(rank=r, world=4))
    with pytest.warns(sptrace.load.TraceWarning, match=r"1 of 4 ranks has no trace \(2\): cross-rank matching"):
        run = sptrace.load_run(tmp_path, cache=False)
    assert run.missing_ranks == [2] and sorted(run.ranks) == [0, 1, 3]
    assert main(["info", str(tmp_path), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "ranks:        0-1, 3 of world size 4 (missing: 2)" in out and "warning: 1 of 4 ranks" in out


def test_rank_from_file_name_and_unknown_rank(tmp_path):
    write(tmp_path, "rank-0.json", trace_json())
    write(tmp_path, "trace_rank1.json", trace_json())
    run = sptrace.load_run(tmp_path, cache=False)
    assert sorted(run.ranks) == [0, 1] and run.ranks[1].rank_source == "file name" and run.world_size == 2
    write(tmp_path, "mystery.json", trace_json())
    with pytest.raises(TraceError, match=r"mystery\.json: cannot tell which rank this trace is"):
        sptrace.load_run(tmp_path, cache=False)
    alone = sptrace.load_run(tmp_path / "mystery.json", cache=False)  # one file alone: rank 0 of 1
    assert alone.world_size == 1 and alone.ranks[0].rank_source == "single file"


def test_a_boolean_rank_or_world_size_is_not_a_number(tmp_path):
    """JSON's true and false are no rank: the file name, or the file alone, decides instead."""
    write(tmp_path, "rank3.json", trace_json(rank=False, world=True))
    with pytest.warns(sptrace.load.TraceWarning, match=r"3 of 4 ranks have no trace"):
        run = sptrace.load_run(tmp_path, cache=False)
    assert list(run.ranks) == [3] and run.ranks[3].rank_source == "file name" and run.world_size == 4
    write(tmp_path / "alone", "trace.json", trace_json(rank=True, world=False))
    alone = sptrace.load_run(tmp_path / "alone" / "trace.json", cache=False)
    assert list(alone.ranks) == [0] and alone.world_size == 1 and alone.ranks[0].rank_source == "single file"


def test_hta_outputs_are_skipped_and_bad_ranks_can_be_skipped(tmp_path, capsys):
    write(tmp_path, "rank0.json", trace_json(rank=0, world=2))
    write(tmp_path, "rank0_with_counters.json", trace_json(rank=0, world=2))
    write(tmp_path, "rank1.json", trace_json(rank=1, world=2)[:40])
    with pytest.raises(TraceError, match=r"rank1\.json: invalid JSON"):
        sptrace.load_run(tmp_path, cache=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = sptrace.load_run(tmp_path, cache=False, skip_bad=True)
    assert sorted(run.ranks) == [0] and run.missing_ranks == [1]
    texts = [str(w.message) for w in seen]
    assert any("rank0_with_counters.json: written by HTA" in t for t in texts)
    assert any("rank1.json: invalid JSON" in t for t in texts)
    assert main(["info", str(tmp_path), "--no-cache"]) == 2
    capsys.readouterr()
    assert main(["info", str(tmp_path), "--no-cache", "--skip-bad"]) == 0
    assert "skipped: " in capsys.readouterr().out


def test_other_json_beside_the_traces_is_listed_not_read(tmp_path, capsys):
    # GIVEN rank traces and a job's other JSON files: a config, metrics (gzipped), a truth file
    write(tmp_path, "rank0.json", trace_json(rank=0, world=2))
    write(tmp_path, "rank1.json", trace_json(rank=1, world=2))
    write(tmp_path, "truth.json", json.dumps({"stray": None, "seq": 64}))
    write(tmp_path, "config.json", "[1, 2]")
    (tmp_path / "metrics.json.gz").write_bytes(gzip.compress(b'{"loss": [2.5, 2.1]}'))
    run = sptrace.load_run(tmp_path, cache=False)
    assert sorted(run.ranks) == [0, 1]
    assert sorted(p.name for p, _ in run.skipped) == ["config.json", "metrics.json.gz", "truth.json"]
    assert main(["info", str(tmp_path), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert all(f"skipped: {tmp_path / n}: not a profiler trace" in out for n in ("truth.json", "config.json"))
    # a file named as a rank's trace is read whatever it holds: broken, it is an error, never skipped
    write(tmp_path, "rank1.json", json.dumps({"results": []}))
    assert main(["info", str(tmp_path), "--no-cache"]) == 2
    assert "rank1.json: no traceEvents" in capsys.readouterr().err


def test_all_ranks_bad_is_an_error_even_when_skipping(tmp_path):
    write(tmp_path, "rank0.json", "{")
    with pytest.raises(TraceError, match="no usable trace"):
        sptrace.load_run(tmp_path, cache=False, skip_bad=True)


def test_bad_flags_for_info(capsys):
    assert main(["info"]) == 2
    assert "the following arguments are required: path" in capsys.readouterr().err
    assert main(["info", ".", "--format", "xml"]) == 2
