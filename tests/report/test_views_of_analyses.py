"""GIVEN the small 2-rank reference runs committed under tests/golden/runs (no launch needed)
WHEN the HTML report and the dashboard's Compare page render their analyses
THEN the report draws the analyses it is handed (the CLI runs them) and computes nothing, and
both views draw one model sweep: the analysis's own (RunAnalysis.model_sweep), at the run's
declared model, said in the page; a run that declares too little is not swept at all."""

from __future__ import annotations

import json
import shutil

import pytest
from plotly.utils import PlotlyJSONEncoder
from sptrace.dashboards.app import create_app
from sptrace.dashboards.pages import compare
from sptrace.dashboards.pages.common import View

from sptrace.analysis import analyse_run
from sptrace.report.html import render_html
from sptrace.vocab.errors import SptraceError
from tests.golden.make_golden import RUNS
from tests.report.test_html_report import unpack, without_scripts


@pytest.fixture(scope="module")
def ring():
    return analyse_run(RUNS / "ring")


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """The megatron run without its run.json: nothing of its model is declared."""
    path = tmp_path_factory.mktemp("bare") / "bare"
    path.mkdir()
    for trace in (RUNS / "megatron").glob("rank*"):
        shutil.copy(trace, path / trace.name)
    return path


def test_the_report_renders_the_analyses_it_is_given(ring, tmp_path, monkeypatch):
    sweep = ring.model_sweep
    assert sweep is not None and sweep.model is ring.model

    # the renderer computes no model: with the cost model gone, the page still draws the sweep
    def computed(*args, **kwargs):
        pytest.fail("the report computed")

    monkeypatch.setattr("sptrace.costmodel.sweep.estimate_comm", computed)
    page = render_html([(RUNS / "ring", ring), (tmp_path / "broken", SptraceError("broken: invalid JSON"))])
    text = without_scripts(page)
    assert "ring</a>: collectives" in text and "broken</a>: unusable" in text and "broken: invalid JSON" in text
    heading = f"<h3>the cost model across sequence lengths at the model of this run: {sweep.describe()}</h3>"
    assert text.count(heading) == 1 and "ring P=2 L=1 B=2 S=32" in heading
    plots = json.loads(unpack(page, "sptrace-figures"))
    drawn = next(p for p in plots if p["layout"]["title"]["text"] == "model: wire bytes per rank and step")
    assert [t["name"] for t in drawn["data"]] == list(sweep.wire_bytes)


def test_compare_sweeps_the_first_chosen_run_that_declares_its_model(bare):
    app = create_app([bare, RUNS / "ring"])
    store = app.sptrace_store

    def page(runs):
        return json.dumps(compare.render(store, View("compare", runs=runs)), cls=PlotlyJSONEncoder)

    both = page([0, 1])
    a = store.get(1)
    assert f"at ring's model: {a.model_sweep.describe()}" in both  # what the sweep is of, as the report says
    assert '"compare-sweep"' in both and "usp (U=2)" in both
    assert store.get(0).model_sweep is None  # the bare run declares nothing: never a sweep of guessed sizes
    alone = page([0])
    assert '"compare-sweep"' not in alone and "no chosen run declares every size the cost model needs" in alone
    assert "reference models" not in alone
