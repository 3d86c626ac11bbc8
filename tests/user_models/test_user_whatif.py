"""GIVEN an 8-rank Megatron-style job written the way users write it (plain torch.profiler, four
profiled steps, no sptrace markers) in which one rank sleeps T ms inside layer 1 (a Stall module
before the layer's work), profiled at T = 80, 40 and 0 ms in one launch
WHEN `sptrace whatif` replays the 80 ms run with the stalling module at half its time, and with
every rank's compute balanced to the median rank's
THEN the replays with no change reproduce each run's step, the half-stall predicts the 40 ms run's
step and the balanced replay the run without a stall (the mean over the profiled steps), each
within the two runs' own noise (the spread of their profiled steps); and the time each prediction
saves is the time the job slept (half of it; most of it). The oracle is the job's record of where
it slept and for how long, timed around each sleep, and the runs measured at 40 and 0 ms, never
sptrace's cost model."""

from __future__ import annotations

import json
import re

import pytest

from sptrace.analysis import analyse_run
from sptrace.cli import main
from sptrace.detect.layers import layer_of
from sptrace.reduce.replay import Changes
from sptrace.whatif import what_if

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def runs(user_runs, private_cache):
    analyses = {ms: analyse_run(user_runs / f"sleep_{ms}", parts=("collectives", "path", "whatif"),
                                load_options={"cache_dir": private_cache, "workers": 1})
                for ms in (80, 40, 0)}  # fmt: skip
    records = [json.loads(p.read_text()) for p in (user_runs / "oracle" / "sleepy_rank").glob("rank*.json")]
    truth = next(r for r in records if r["slept_ms"] is not None)
    return analyses, truth


def spread_us(analysis) -> float:
    """The run's own noise: its profiled steps' spread (slowest less fastest)."""
    steps = [g.measured_us for g in analysis.replay_graphs]
    assert len(steps) == 4
    return max(steps) - min(steps)


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def slept_us(truth) -> float:
    """The mean sleep of the profiled steps (the job's first is the profiler's warm-up)."""
    return mean(truth["slept_ms"]["sleep_80"][1:]) * 1e3


def saved_us(result) -> float:
    """The mean over the steps of what the change saves against the replay with no change."""
    return mean(s.baseline_us - s.predicted_us for s in result.steps)


def close(predicted, measured, *runs) -> None:
    """The mean predicted step against the mean measured one, within the runs' own noise."""
    gap = abs(mean(s.predicted_us for s in predicted.steps) - mean(s.measured_us for s in measured.steps))
    assert gap <= sum(spread_us(a) for a in runs), (gap, [spread_us(a) for a in runs])


def test_each_run_is_replayed_as_measured(runs):
    analyses, _ = runs
    for a in analyses.values():
        result = what_if(a, Changes())
        assert abs(result.error) <= 0.05 and result.calibrated


def test_half_the_stall_predicts_the_40_ms_run(runs, capsys, user_runs, private_cache):
    analyses, truth = runs
    slow, half = analyses[80], analyses[40]
    culprit = slow.critical_path.culprit  # what analyze names: the user scales that module
    assert (culprit.rank, layer_of(culprit.module)) == (truth["rank"], truth["layer"])
    result = what_if(slow, Changes(modules=((culprit.module, 0.5),)))
    close(result, what_if(half, Changes()), slow, half)
    # each step saves half of what the job slept in it (the stall was the last arrival by far)
    assert 0.8 * slept_us(truth) / 2 <= saved_us(result) <= 1.05 * slept_us(truth) / 2
    # the command says the same
    argv = ["whatif", str(user_runs / "sleep_80"), "--scale", f"module={culprit.module}:0.5",
            "--format", "json", "--cache-dir", str(private_cache)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["predicted_ms"] == pytest.approx(result.predicted_us / 1e3)
    assert data["critical_path"]["step_us"] > 0


def test_balance_predicts_the_run_without_a_stall(runs):
    analyses, truth = runs
    slow, none = analyses[80], analyses[0]
    result = what_if(slow, Changes(balance=True))
    close(result, what_if(none, Changes()), slow, none)
    # most of the sleep is saved (what is left waits on the next-latest rank, which the noise sets;
    # the other ranks' compute, balanced too, may save more)
    assert saved_us(result) >= 0.6 * slept_us(truth)


def test_analyze_names_the_stall_a_code_path_of_one_rank(runs):
    """Imbalance by cause: the rank that sleeps in one layer, in every profiled step, is a code path
    of that rank in that module (not a slow device); the run without the sleep names no such cause."""
    analyses, truth = runs
    balance = analyses[80].balance
    assert balance is not None and balance.steps == 4
    # the stalled rank first, far ahead of anything else: on 2 loaded cores, the OS can slow one
    # other rank in one layer's backward in every step too (a CI run named ranks 6 and 7 at 1.6x
    # and 1.75x beside the stall's 27.6x), which the rule rightly reports, and this test allows
    paths = sorted((c for c in balance.causes if c.code == "code-path"), key=lambda c: -c.ratio)
    assert paths and paths[0].ranks == (truth["rank"],), balance.line()
    assert all(c.ratio * 4 < paths[0].ratio for c in paths[1:]), balance.line()
    # the module as the Python stacks name it (layers.1.Stall_0: the job has no sptrace markers)
    named = re.search(r"in (\S+) forward only", paths[0].text)
    assert named and layer_of(named.group(1)) == truth["layer"] and "stall" in named.group(1).lower(), paths[0].text
    assert paths[0].ratio >= 1.5 and not [c for c in balance.causes if c.code == "slow-device"]
    quiet = analyses[0].balance
    assert quiet is not None and not [c for c in quiet.causes if named.group(1) in c.text], quiet.line()
