"""GIVEN the clean 8-rank Megatron-SP reference run, and drawn mutations of one collective on one
rank written into a copy of that rank's trace (a group of half the size, the collective removed,
an extra one, another dtype, another size), the generator recording what it changed and where
(the rank, and the layer and phase its sptrace.comm marker names)
WHEN `sptrace analyze` compares the run with the Megatron cost model
THEN the clean run is a MATCH and every mutated one a MISMATCH with a finding on the mutated rank,
in the mutated layer, of the kind the mutation is."""

from __future__ import annotations

import copy
import gzip
import json
import random

import pytest

from sptrace.cli import main

pytestmark = pytest.mark.distributed
MUTATIONS = {
    # what a correct analyzer must call each (never derived from sptrace's own cost model)
    "group": {"wrong-group", "wrong-size"},
    "missing": {"missing-collective"},
    "extra": {"extra-collective"},
    "dtype": {"wrong-size"},
    "resized": {"wrong-size"},
}
OPS = ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")
ANNOTATION = {"c10d::_allgather_base_": "gloo:all_gather", "c10d::_reduce_scatter_base_": "gloo:all_reduce"}


def draws(n: int = 6, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    kinds = list(MUTATIONS)
    rng.shuffle(kinds)
    return [
        {"mutation": kinds[i % len(kinds)], "rank": rng.randrange(8), "op": rng.choice(OPS), "k": rng.randrange(4)}
        for i in range(n)
    ]


def _within(outer: dict, inner: dict) -> bool:
    return (
        outer["tid"] == inner["tid"]
        and outer["ts"] <= inner["ts"]
        and inner["ts"] + inner.get("dur", 0) <= (outer["ts"] + outer.get("dur", 0))
    )


def mutate(trace: dict, draw: dict) -> dict:
    """Apply one mutation to the draw's k-th op; return where it was (layer, phase) as the trace's
    own sptrace.comm marker names it."""
    events = trace["traceEvents"]
    ops = sorted((e for e in events if e.get("name") == draw["op"] and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    op = ops[draw["k"]]
    marker = next(e for e in events if str(e.get("name", "")).startswith("sptrace.comm::") and _within(e, op))
    _, module, role = marker["name"].split("::", 2)
    where = {"layer": int(module.split(".")[1]), "phase": "backward" if "_bwd" in role else "forward"}
    # the k-th worker annotation of this op's kind, in time, carries its transfer (gloo runs
    # them in order; the file lists threads one after another)
    notes = sorted((e for e in events if e.get("name") == ANNOTATION[draw["op"]]), key=lambda e: e["ts"])
    note = notes[draw["k"]] if draw["op"] == "c10d::_allgather_base_" else None
    dims = op["args"]["Input Dims"]
    m = draw["mutation"]
    if m == "group":  # the output of a group of P/2: half the gathered rows, or twice the shard
        if draw["op"] == "c10d::_allgather_base_":
            dims[0][0] //= 2
        else:
            dims[0][0] *= 2
        marker["name"] = marker["name"].replace("|group=8", "|group=4")
    elif m == "missing":
        events.remove(op)
        if note is not None:
            events.remove(note)
    elif m == "extra":  # a second call, made after the first returns and before the thread's next event
        end = op["ts"] + op["dur"]
        after = min(e["ts"] for e in events if e.get("tid") == op["tid"] and e.get("ph") == "X" and e["ts"] > end)
        twin = copy.deepcopy(op)
        # (never overlapping that next event: one thread's events nest or follow each other, and
        # a call as long as a slow first one could swallow the next collective)
        twin["ts"] = end + 0.5
        twin["dur"] = min(op["dur"], (after - end) / 2)
        twin["args"]["External id"] = -1
        events.append(twin)
        marker["dur"] = max(marker["dur"], twin["ts"] + twin["dur"] - marker["ts"] + 0.1)
    elif m == "dtype":
        op["args"]["Input type"] = ["c10::BFloat16" if t == "float" else t for t in op["args"]["Input type"]]
        if note is not None:
            note["args"]["Input type"] = ["c10::BFloat16"]
    elif m == "resized":  # a batch of 1 where the model's is 2
        dims[0][1] = dims[1][1] = 1
        if note is not None:
            note["args"]["Input Dims"][0][1] = 1
    return where


@pytest.fixture(scope="module")
def megatron(profiled):
    return profiled("megatron")


def _analyze(run, capsys, cache):
    code = main(["analyze", str(run), "--format", "json", "--cache-dir", str(cache), "--workers", "1"])
    return code, json.loads(capsys.readouterr().out)


def test_clean_run_matches(megatron, capsys, private_cache):
    code, report = _analyze(megatron, capsys, private_cache)
    assert code == 0 and report["verdict"]["label"] == "MATCH", report["findings"]


@pytest.mark.parametrize("draw", draws(), ids=lambda d: f"{d['mutation']}-rank{d['rank']}-{d['op'][6:]}#{d['k']}")
def test_every_drawn_mutation_is_a_mismatch_where_it_was_made(megatron, draw, tmp_path, capsys, private_cache):
    run = tmp_path / "run"
    run.mkdir()
    for f in megatron.iterdir():
        if f.is_file() and f.name != f"rank{draw['rank']}.pt.trace.json.gz":
            (run / f.name).symlink_to(f)
    trace = json.loads(gzip.open(megatron / f"rank{draw['rank']}.pt.trace.json.gz").read())
    where = mutate(trace, draw)
    (run / f"rank{draw['rank']}.json").write_text(json.dumps(trace))
    code, report = _analyze(run, capsys, private_cache)
    assert code == 1 and report["verdict"]["label"] == "MISMATCH", (draw, report["verdict"])
    here = [f for f in report["findings"] if draw["rank"] in f["ranks"] and f["layer"] == where["layer"]]
    assert {f["code"] for f in here} & MUTATIONS[draw["mutation"]], (draw, where, report["findings"])
    # the other ranks are clean: no error names only them
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert all(draw["rank"] in f["ranks"] for f in errors), errors
