"""GIVEN reference runs profiled the way `sptrace profile` profiles by default (two steps after the
warm-up; 2 gloo ranks, one layer), clean and with a stray full-size save
WHEN analyze, check and diff read them
THEN every figure is per step (each step's collectives matched against the model, the wire bytes
per rank and step), every boundary of both steps is judged, a stray fails in each step it ran in,
and a run against itself changes nothing."""

from __future__ import annotations

import json

import pytest

from sptrace.cli import main

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("two-steps")
    matrix = out / "matrix.json"
    matrix.write_text(json.dumps({"defaults": {"nproc": 2, "layers": 1, "seq": 32}, "runs": {
        "megatron": {"scheme": "megatron"}, "ulysses": {"scheme": "ulysses"}, "ring": {"scheme": "ring"},
        "megatron-stray": {"scheme": "megatron", "fault": "stray-full-save"}}}))  # fmt: skip
    assert main(["profile", "--matrix", str(matrix), "--out", str(out), "--warmup", "1", "--device", "cpu"]) == 0
    return out


def run_json(*argv, capsys):
    code = main([*argv, "--format", "json", "--no-cache"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["megatron", "ulysses", "ring"])
def test_each_step_matches_the_model_and_is_judged(runs, name, capsys):
    assert json.loads((runs / name / "run.json").read_text())["profiled_steps"] == [1, 2]
    code, a = run_json("analyze", str(runs / name), capsys=capsys)
    assert code == 0 and a["verdict"]["label"] == "MATCH", a["verdict"]
    per_rank = {r["rank"]: r for r in a["ranks"]}
    assert all(r["observed"] == r["expected"] for r in per_rank.values())  # one step's worth, per step
    code, rows = run_json("collectives", str(runs / name), capsys=capsys)
    rows = rows if isinstance(rows, list) else rows["collectives"]
    counts = {}
    for r in rows:
        counts[(r["rank"], r["step"])] = counts.get((r["rank"], r["step"]), 0) + 1
    assert {s for _, s in counts} == {1, 2} and len(set(counts.values())) == 1  # the same collectives each step
    code, c = run_json("check", str(runs / name), capsys=capsys)
    assert code == 0 and c["verdict"]["status"] == "pass", c["verdict"]
    assert c["coverage"]["steps"] == [1, 2] and c["coverage"]["boundaries"] == 2 * 2  # each step, each rank
    assert c["coverage"]["census"] == [0, 1]  # the instrumented reference model wrote its census


def test_a_stray_fails_in_each_step(runs, capsys):
    code, c = run_json("check", str(runs / "megatron-stray"), capsys=capsys)
    assert code == 1
    found = [f for f in c["findings"] if f["code"] == "full-size-save"]
    # one finding per kept tensor, however many steps kept it: the message says "of steps 1-2" and
    # the JSON lists each boundary
    assert found and all([b["step"] for b in f["boundaries"]] == [1, 2] for f in found)
    assert all(" of steps 1-2 " in f["message"] for f in found)
    assert all(f["ranks"] == [0, 1] and f["holder"] == "autograd" for f in found)


def test_a_two_step_run_against_itself_changes_nothing(runs, capsys):
    code, d = run_json("diff", str(runs / "megatron"), str(runs / "megatron"), capsys=capsys)
    assert code == 0 and d["same"] and not d["regressions"]
