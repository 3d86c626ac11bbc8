"""GIVEN the committed 2-rank runs (tests/golden/runs: megatron, and ring, whose attention passes
blocks rank to rank by send and receive) and, when present, the corpus's 8-rank DLRM GPU traces
WHEN `sptrace export` merges a run's ranks into one trace
THEN the trace is the Trace Event Format (every event checked against a schema written here from
the format's documentation), sptrace's own loader reads it back with each rank's events (as many
as the rank recorded, per kind kept), the ranks' clocks are aligned (the members of a matched
collective end together), flows link each matched collective's members and each send to its
receive, --ranks / --window / --no-events write what they say, bad flags are one line and exit
2, and the dashboard streams the same trace for the ranks its Timeline shows."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from sptrace.analysis import analyse_run
from sptrace.cli import main
from sptrace.export import ExportOptions, choose_ranks, export_run, parse_window
from sptrace.load.trace import load_trace
from sptrace.run.ranks import load_run
from sptrace.vocab.errors import UsageError
from sptrace.vocab.units import parse_ranks
from tests.golden.make_golden import reference_runs

RUNS = reference_runs()
KEPT = ["X", "i", "I", "C", "s", "t", "f"]

# The Trace Event Format (Google's "Trace Event Format" document): the JSON object form, and per
# phase the fields its readers need. pid and tid are 32-bit unsigned in Perfetto's importer.
_ID = {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}
_NAME = {"properties": {"args": {"required": ["name"], "properties": {"name": {"type": "string"}}}}}
_SORT = {"properties": {"args": {"required": ["sort_index"], "properties": {"sort_index": {"type": "integer"}}}}}
EVENT = {
    "type": "object",
    "required": ["ph", "name", "pid"],
    "properties": {
        "ph": {"enum": ["X", "i", "I", "C", "s", "t", "f", "M"]},
        "name": {"type": "string"}, "cat": {"type": "string"}, "pid": _ID, "tid": _ID,
        "ts": {"type": "number", "minimum": 0}, "dur": {"type": "number", "minimum": 0},
        "id": {"type": ["integer", "string"]}, "bp": {"const": "e"}, "s": {"enum": ["g", "p", "t"]},
        "args": {"type": "object"},
    },
}  # fmt: skip
PHASES = {
    "X": {"required": ["ts", "dur", "tid"]},
    "i": {"required": ["ts", "tid"]},
    "C": {"required": ["ts", "args"], "properties": {"args": {"additionalProperties": {"type": "number"}}}},
    "s": {"required": ["ts", "tid", "id", "cat"]},
    "f": {"required": ["ts", "tid", "id", "cat"]},
    "M": {"required": ["args"], "not": {"required": ["ts"]}, "oneOf": [
        {"properties": {"name": {"enum": ["process_name", "thread_name", "process_labels"]}}, **_NAME},
        {"properties": {"name": {"enum": ["process_sort_index", "thread_sort_index"]}}, **_SORT}]},
}  # fmt: skip
PHASES["I"], PHASES["t"] = PHASES["i"], PHASES["s"]
TRACE = {
    "type": "object",
    "required": ["traceEvents"],
    "additionalProperties": False,  # Perfetto stops reading at a top-level key it does not know
    "properties": {"displayTimeUnit": {"enum": ["ms", "ns"]}, "traceEvents": {"type": "array"},
                   "otherData": {"type": "object"}},
}  # fmt: skip


def validate(trace: dict) -> None:
    """The trace against TRACE, and each event against EVENT and its phase's own schema (compiled
    by fastjsonschema, of the dev extra: jsonschema takes half a millisecond an event)."""
    import fastjsonschema

    def check(schema: dict):
        return fastjsonschema.compile({"$schema": "http://json-schema.org/draft-07/schema#", **schema})

    check(TRACE)(trace)
    by_phase = {ph: check({"allOf": [EVENT, one]}) for ph, one in PHASES.items()}
    for event in trace["traceEvents"]:
        by_phase[event["ph"]](event)


@pytest.fixture(scope="module")
def analyses(private_cache):
    return {name: analyse_run(RUNS[name], parts=("collectives",), load_options={"cache_dir": private_cache})
            for name in ("megatron", "ring")}  # fmt: skip


def read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def own(event: dict) -> bool:
    return event.get("cat", "").startswith("sptrace.")


def recorded_counts(run: Path) -> dict[int, Counter]:
    """Per rank, its trace's events of the kinds a merged trace keeps, by ph."""
    return {t.rank: Counter(t.events.loc[t.events["ph"].isin(KEPT), "ph"].astype(str)) for t in load_run(run)}


def export(a, tmp_path: Path, name: str = "merged.json.gz", **options) -> tuple[dict, object]:
    summary = export_run(a, tmp_path / name, ExportOptions(**options))
    return read(tmp_path / name), summary


def test_the_trace_reads_back_with_every_rank_and_its_events(analyses, tmp_path, private_cache):
    a = analyses["megatron"]
    trace, summary = export(a, tmp_path)
    merged = load_trace(tmp_path / "merged.json.gz", rank=0, cache=False).events  # sptrace's own loader
    theirs = merged[~merged["raw_cat"].astype(str).str.startswith("sptrace.") & (merged["ph"] != "M")]
    got = {int(pid): Counter(g["ph"].astype(str)) for pid, g in theirs.groupby("pid", observed=True)}
    assert got == recorded_counts(RUNS["megatron"])
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {0: "rank 0", 1: "rank 1"}.items() <= names.items()
    tracks = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    for rank in (0, 1):
        assert {(rank, t) for t in ("phases", "layers", "modules", "collectives", "memory")} <= tracks
        slices = Counter(e["cat"] for e in trace["traceEvents"] if e["pid"] == rank and own(e) and e["ph"] == "X")
        assert slices["sptrace.collective"] == (a.collectives["rank"] == rank).sum()
        assert slices["sptrace.phase"] == (a.phases["rank"] == rank).sum()
        assert slices["sptrace.layer"] >= 2  # layer 0's forward and its backward
        counter = [e for e in trace["traceEvents"] if e["pid"] == rank and e["ph"] == "C"]
        assert len(counter) == (a.memory["rank"] == rank).sum() and counter[0]["args"]["allocated bytes"] > 0
    assert summary.events == len(trace["traceEvents"]) == trace["otherData"]["events"]
    assert summary.bytes_in == sum(p.stat().st_size for p in RUNS["megatron"].glob("rank*"))
    assert summary.bytes_out == (tmp_path / "merged.json.gz").stat().st_size
    path = getattr(a, "critical_path", None)
    segments = [e for e in trace["traceEvents"] if e.get("cat") == "sptrace.critical_path"]
    assert len(segments) == (0 if path is None else len(path.segments))


@pytest.mark.parametrize("name", ["megatron", "ring"])
def test_every_event_is_in_the_trace_event_format(analyses, tmp_path, name):
    trace, _ = export(analyses[name], tmp_path, "merged.json")  # not gzip: a plain .json
    validate(trace)
    assert next(iter(trace)) == "displayTimeUnit"  # Perfetto reads it only before the events
    for (pid, tid), events in _by_track(trace).items():  # a track's slices nest (the format's rule)
        open_ends: list[int] = []
        for start, end, e in sorted((*ns(e), e) for e in events):  # by start, then the parent first
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or -end <= open_ends[-1], (pid, tid, e)
            open_ends.append(-end)


def ns(e: dict) -> tuple[int, int]:
    """(start, -end) of a slice in integer ns (us with three decimals, as written)."""
    start = round(e["ts"] * 1e3)
    return start, -(start + round(e["dur"] * 1e3))


def _by_track(trace: dict) -> dict[tuple[int, int], list[dict]]:
    """sptrace's slices by (pid, tid) (the recorded ones are as the profiler wrote them)."""
    tracks = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and own(e):
            tracks[(e["pid"], e["tid"])].append(e)
    return tracks


def flows_of(trace: dict) -> dict[int, list[dict]]:
    """sptrace's flows by id, each checked to bind to a collective slice: same pid and tid, its ts
    strictly inside the slice (the Trace Event Format binds s, and f with bp e, to the enclosing
    slice). Each flow event gets its slice as "slice"."""
    tracks = _by_track(trace)
    out = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] in "sf" and e.get("cat") == "sptrace.collective":
            at = round(e["ts"] * 1e3)
            inside = [s for s in tracks[(e["pid"], e["tid"])] if ns(s)[0] < at < -ns(s)[1]]
            assert len(inside) == 1 and inside[0]["cat"] == "sptrace.collective", e
            out[e["id"]].append({**e, "slice": inside[0]})
    return out


def test_flows_link_each_matched_collective_and_each_send_to_its_receive(analyses, tmp_path):
    a = analyses["ring"]
    trace, summary = export(a, tmp_path)
    flows = flows_of(trace)
    members = a.matching.members
    matched = members.groupby(["group", "key"])["rank"].nunique()
    assert len(flows) == summary.flows == (matched > 1).sum()
    for events in flows.values():
        assert [e["ph"] for e in events].count("s") == 1 and len(events) >= 2
        start = next(e for e in events if e["ph"] == "s")
        assert all(e["bp"] == "e" and e["pid"] != start["pid"] for e in events if e["ph"] == "f")
    # each send to its receive: a flow from the sender's send slice to the receiver's recv slice
    pairs = a.matching.pairing.pairs
    sends = [(e["pid"], [f["pid"] for f in ev if f["ph"] == "f"]) for ev in flows.values() for e in ev
             if e["ph"] == "s" and e["slice"]["name"] == "send"]  # fmt: skip
    assert sorted((src, dst[0]) for src, dst in sends) == sorted(zip(pairs["src"], pairs["dst"]))
    assert all(f["slice"]["name"] == "recv" for ev in flows.values() for f in ev
               if f["ph"] == "f" and ev[0]["slice"]["name"] == "send")  # fmt: skip


def test_the_ranks_clocks_are_aligned(analyses, tmp_path):
    """Matching sets each rank's offset to the median of its collectives' end minus the reference
    rank's: on the merged clock the median spread of a collective's member ends is ~0, where the
    trace clocks are 2.27 ms apart; and every event of rank 1 is moved by exactly that offset."""
    a = analyses["megatron"]
    offset = a.offsets_us[1]
    assert abs(offset) > 1000
    trace, _ = export(a, tmp_path)
    ends = [{e["pid"]: e["slice"]["ts"] + e["slice"]["dur"] for e in ev} for ev in flows_of(trace).values()]
    assert len(ends) == 11
    assert abs(statistics.median(e[1] - e[0] for e in ends)) < 1.0  # us
    zero = trace["otherData"]["ts_zero_us"]
    first = min((e for e in trace["traceEvents"] if e["pid"] == 1 and e["ph"] == "X" and not own(e)),
                key=lambda e: e["ts"])  # fmt: skip
    recorded = load_trace(RUNS["megatron"] / "rank1.pt.trace.json.gz", cache=False).events
    x = recorded[recorded["ph"] == "X"]
    assert round(first["ts"] * 1e3) == int(x["ts_ns"].min()) - round(offset * 1e3) - round(zero * 1e3)  # exact, ns


def test_ranks_window_and_no_events_write_what_they_say(analyses, tmp_path):
    a = analyses["megatron"]
    full, _ = export(a, tmp_path, "full.json.gz")
    one, _ = export(a, tmp_path, "one.json.gz", ranks=(1,))
    cp = a.run.world_size  # the critical path's process
    assert {e["pid"] for e in one["traceEvents"]} - {cp} == {1}
    assert not flows_of(one)  # one rank: nothing to link
    assert kinds(one, 1) == kinds(full, 1) and kinds(one, 1, own_too=False) == kinds(full, 1, own_too=False)
    window, _ = export(a, tmp_path, "window.json.gz", window_ms=(10.0, 20.0))
    step = window["otherData"]["step_start_ts"]
    lo, hi = step + 10_000, step + 20_000
    timed = [e for e in window["traceEvents"] if "ts" in e]
    assert 0 < len(timed) < len([e for e in full["traceEvents"] if "ts" in e]) / 2
    # every event overlaps the window; a flow binds to a collective slice that does (flows_of)
    assert all(e["ts"] < hi and e["ts"] + e.get("dur", 0) >= lo for e in timed if e.get("cat") != "sptrace.collective"
               or e["ph"] == "X") and flows_of(window)  # fmt: skip
    inside = [e for e in full["traceEvents"] if "ts" in e and e["ts"] < hi and e["ts"] + e.get("dur", 0) >= lo]
    assert Counter(e["ph"] for e in timed if e["ph"] == "X") == Counter(e["ph"] for e in inside if e["ph"] == "X")
    assert window["otherData"]["window_ts"] == pytest.approx([lo, hi], abs=1e-3)
    bare, _ = export(a, tmp_path, "bare.json.gz", events=False)
    assert all(own(e) for e in bare["traceEvents"] if e["ph"] != "M")
    assert Counter((e["pid"], e["cat"], e["ph"]) for e in bare["traceEvents"] if own(e)) == Counter(
        (e["pid"], e["cat"], e["ph"]) for e in full["traceEvents"] if own(e))  # fmt: skip


def kinds(trace: dict, pid: int, own_too: bool = True) -> Counter:
    """The process's events by (ph, cat): the recorded ones, or sptrace's but its flows."""
    return Counter((e["ph"], e.get("cat")) for e in trace["traceEvents"] if e["pid"] == pid and e["ph"] not in "sfM"
                   and own(e) == own_too)  # fmt: skip


def test_the_cli_writes_it_and_says_so_in_one_line(tmp_path, capsys, private_cache):
    out = tmp_path / "merged.json.gz"
    cache = ["--cache-dir", str(private_cache)]
    assert main(["export", str(RUNS["ring"]), "-o", str(out), "--ranks", "0-1", *cache]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"sptrace: wrote {out}: 2 ranks, ")
    assert "x the 2 input traces'" in err[0]
    assert read(out)["otherData"]["ranks"] == "0-1"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--ranks", "0-3"], "--ranks: 2-3 are not in the run (its ranks: 0-1)"),
        (["--ranks", "1-x"], "--ranks '1-x'"),
        (["--window", "20:5"], "the end must come after the start"),
        (["--window", "soon"], "give START:END in ms"),
        (["--window", "900:950"], "--window 900:950 holds nothing"),
        (["--group", "nope"], "--group 'nope' is no process group"),
        (["--ranks", "0", "--group", "0"], "not allowed with argument"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, private_cache, flags, said):
    out = tmp_path / "merged.json.gz"
    assert main(["export", str(RUNS["megatron"]), "-o", str(out), "--cache-dir", str(private_cache), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sptrace: error: ") and said in err[0]
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, not even a temporary


def test_no_such_run_or_a_folder_to_write_is_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "-o", str(tmp_path / "m.json")]) == 2
    assert capsys.readouterr().err.strip() == f"sptrace: error: {tmp_path / 'nope'}: no such file or directory"
    assert main(["export", str(RUNS["megatron"]), "-o", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"sptrace: error: {tmp_path}: is a directory; name the file to write "
        "(merged.json.gz)"
    )


def test_rank_lists_and_windows_parse_as_documented():
    assert parse_ranks("0-3,63") == (0, 1, 2, 3, 63)
    assert parse_ranks("5, 1-2") == (1, 2, 5)
    assert parse_window("10:25.5") == (10.0, 25.5) and parse_window("-1:") == (-1.0, None)
    for bad in ("3-1", "-1", "a", ""):
        with pytest.raises(UsageError):
            parse_ranks(bad)
    for bad in ("5", ":", "5:5", "x:1"):
        with pytest.raises(UsageError):
            parse_window(bad)


def test_past_the_limit_the_choice_is_said(analyses):
    a = analyses["megatron"]
    assert choose_ranks(a) == ((0, 1), None)
    ranks, note = choose_ranks(a, limit=1)  # its only group holds 2 ranks: more than 1
    assert ranks == (0,) and note == "2 ranks: exported the first 1; pass --ranks or --group for others"
    assert choose_ranks(a, group="0") == ((0, 1), None)


def test_the_dashboard_streams_the_ranks_its_timeline_shows(tmp_path, private_cache):
    from sptrace.dashboards.app import create_app
    from sptrace.dashboards.pages import timeline
    from sptrace.dashboards.pages.common import View

    app = create_app([RUNS["ring"]], options={"parts": ("collectives",), "load_options": {"cache_dir": private_cache}})
    client = app.server.test_client()
    page = str(timeline.render(app.sptrace_store, View("timeline", 0, None, {})))
    href = "/export/merged-trace.json.gz?run=0&ranks=0-1"
    assert f"href='{href}'" in page and "download merged trace" in page
    response = client.get(href)
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/gzip"
    assert 'filename="ring-merged.json.gz"' in response.headers["Content-Disposition"]
    trace = json.loads(gzip.decompress(response.data))
    assert {0, 1} <= {e["pid"] for e in trace["traceEvents"]} and flows_of(trace)
    assert client.get("/export/merged-trace.json.gz?run=3").status_code == 404  # only the runs it serves
    assert client.get("/export/merged-trace.json.gz?run=0&ranks=5").status_code == 400


def test_corpus_gpu_ranks_merge_with_their_streams(corpus, tmp_path, private_cache):
    """The DLRM run: 8 ranks of GPU traces, NCCL all-to-alls and all-reduces on CUDA streams."""
    run = corpus / "param_dlrm_kineto"
    a = analyse_run(run, parts=("collectives",), load_options={"cache_dir": private_cache})
    trace, summary = export(a, tmp_path)
    merged = load_trace(tmp_path / "merged.json.gz", rank=0, cache=False).events
    theirs = merged[~merged["raw_cat"].astype(str).str.startswith("sptrace.") & (merged["ph"] != "M")]
    got = {int(pid): Counter(g["ph"].astype(str)) for pid, g in theirs.groupby("pid", observed=True)}
    assert got == recorded_counts(run)
    streams = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {(r, "stream 7") for r in range(8)} <= streams
    flows = flows_of(trace)
    assert len(flows) == 8 and all(len(ev) == 8 for ev in flows.values())  # each collective on every rank
    for ev in flows.values():  # NCCL kernels of one collective end together on the aligned clock
        ends = [e["slice"]["ts"] + e["slice"]["dur"] for e in ev]
        assert max(ends) - min(ends) <= 10.0
    assert summary.bytes_out < summary.bytes_in / 5
