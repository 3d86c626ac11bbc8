"""GIVEN every committed reference run (tests/golden/runs: Megatron-SP, Ulysses, hybrid, ring, USP,
a stray) and the corpus's 8 DLRM GPU ranks (NCCL, a real job's traces)
WHEN `sptrace whatif` replays each step with nothing changed, and with changes whose effect the
measured numbers alone tell
THEN the replay reproduces the measured step within 5% (the calibration, always printed), with no
transfer and no waiting a step keeps at least its slowest rank's own work and idle time, and
waiting or transferring again only adds, text and JSON
say the same, and bad flags are one line and exit 2 before any trace is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sptrace.analysis import analyse_run
from sptrace.cli import main
from sptrace.reduce.replay import Changes
from sptrace.reduce.replay_graph import WAIT
from sptrace.whatif import what_if

RUNS = Path(__file__).resolve().parents[1] / "golden" / "runs"
REFERENCE = sorted(p.name for p in RUNS.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", REFERENCE)
def test_the_replay_with_no_change_reproduces_each_reference_run(name, private_cache):
    a = analyse_run(RUNS / name, parts=("collectives", "path", "whatif"), load_options={"cache_dir": private_cache})
    result = what_if(a, Changes())
    assert result.measured_us == pytest.approx(max(t.step_ms for t in a.timing) * 1e3, rel=1e-6)
    assert abs(result.error) <= 0.05 and result.calibrated
    assert result.predicted_us == result.baseline_us
    # no transfer and nobody waiting leaves at least each rank's own work and idle time; waiting
    # again, or transferring again, only adds
    graph = a.replay_graphs[0]
    alone = max(float(p.dur_us[p.kind != WAIT].sum()) for p in graph.ranks.values())
    lower = what_if(a, Changes(comm=0.0, no_wait=True)).predicted_us
    free = what_if(a, Changes(comm=0.0))
    eps = 1e-6
    assert alone - eps <= lower <= free.predicted_us + eps <= result.baseline_us + 2 * eps
    assert lower <= what_if(a, Changes(no_wait=True)).predicted_us + eps <= result.baseline_us + 2 * eps
    # (what is left of "transfer" on the path is the calls' issue time before their data moved)
    assert free.path is not None and free.path.by_kind()["transfer"] < result.path.by_kind()["transfer"]


def test_the_replay_reproduces_the_corpus_dlrm_ranks(corpus, private_cache):
    a = analyse_run(corpus / "param_dlrm_kineto", parts=("collectives", "path", "whatif"),
                    load_options={"cache_dir": private_cache})  # fmt: skip
    result = what_if(a, Changes())
    assert len(a.replay_graphs[0].ranks) == 8 and abs(result.error) <= 0.05
    # the replay's critical path, unchanged, is analyze's
    assert result.path.step_us == pytest.approx(a.critical_path.step_us, rel=1e-6)
    assert result.path.culprit == a.critical_path.culprit


def test_text_and_json_say_the_same(capsys, private_cache):
    run = str(RUNS / "megatron")
    flags = ["--cache-dir", str(private_cache)]
    assert main(["whatif", run, "--scale", "all_gather=0.5", "--scale", "module=layers.0.mlp:0.5", *flags]) == 0
    text = capsys.readouterr().out
    assert main(["whatif", run, "--scale", "all_gather=0.5", "--scale", "module=layers.0.mlp:0.5",
                 "--format", "json", *flags]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["changes"] == "all_gather x0.5, layers.0.mlp x0.5" and data["calibrated"] is True
    assert data["predicted_ms"] < data["baseline_ms"] == pytest.approx(data["measured_ms"])
    assert text.startswith("what if: all_gather x0.5, layers.0.mlp x0.5\n")
    assert "replayed, no change" in text and "(+0.0% off the measured step, within 5%, one profiled step)" in text
    assert f"{data['gain']:+.1%} against the replay" in text
    assert "predicted critical path:" in text and data["critical_path"]["segments"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scale", "comm"], "--scale comm: write WHAT=FACTOR"),
        (["--scale", "comm=-1"], "--scale comm=-1: the factor must be a number >= 0"),
        (["--scale", "bogus=0.5"], "'bogus' is none of comm, compute, module"),
        (["--scale", "module=0.5"], "write module=PATH:FACTOR"),
        (["--rank", "9", "--scale", "compute=0.5"], "--rank 9: the run has no trace of rank 9"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys, private_cache):
    code = main(["whatif", str(RUNS / "ring"), "--cache-dir", str(private_cache), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err
