"""The what-if's views: the figure (sptrace.report.whatif) on critical paths written by hand, which
must draw the numbers it was given; and the Timeline's what-if panel, server side, on a committed
reference run (its callback replays the step with the panel's values, a bad value is said)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from sptrace.dashboards.app import create_app
from sptrace.dashboards.pages import whatif_panel

from sptrace.reduce.critical import SEGMENT_COLUMNS, CriticalPath
from sptrace.report.whatif import KIND_COLORS, whatif_paths

RUN = Path(__file__).resolve().parents[1] / "golden" / "runs" / "megatron"


def path(*segments: tuple[str, float]) -> CriticalPath:
    """A path of (kind, us) segments, back to back on rank 0 from t=1000 us."""
    rows, t = [], 1000.0
    for kind, dur in segments:
        rows.append({"rank": 0, "kind": kind, "module": "layers.0.mlp", "layer": 0, "phase": "forward",
                     "start_us": t, "dur_us": dur, "collective": None, "waiting": 0, "lane": "cpu"})  # fmt: skip
        t += dur
    return CriticalPath(step_us=t - 1000.0, start_us=1000.0, segments=pd.DataFrame(rows, columns=SEGMENT_COLUMNS))


def test_the_figure_stacks_each_paths_time_by_kind():
    measured = path(("compute", 3000.0), ("transfer", 4000.0), ("idle", 1000.0), ("transfer", 2000.0))
    predicted = path(("compute", 3000.0), ("transfer", 3000.0), ("idle", 1000.0))
    fig = whatif_paths(measured, predicted)
    assert fig.layout.barmode == "stack"
    bars = {t.name: t for t in fig.data}
    assert list(bars) == ["compute", "transfer", "wait", "idle"]  # every kind, in the path's order
    assert all(t.orientation == "h" and list(t.y) == ["measured", "predicted"] for t in fig.data)
    assert list(bars["compute"].x) == [3.0, 3.0]
    assert list(bars["transfer"].x) == [6.0, 3.0]  # both transfers of the measured path, in ms
    assert list(bars["wait"].x) == [0.0, 0.0] and list(bars["idle"].x) == [1.0, 1.0]
    assert list(bars["transfer"].customdata) == pytest.approx([0.6, 3 / 7])  # share of its own path
    assert bars["transfer"].marker.color == KIND_COLORS["transfer"]
    # each bar's length at its end, and measured drawn on top
    assert [(a.y, a.x, a.text.strip()) for a in fig.layout.annotations] == [("measured", 10.0, "10.00 ms"),
                                                                           ("predicted", 7.0, "7.00 ms")]  # fmt: skip
    assert list(fig.layout.yaxis.categoryarray) == ["predicted", "measured"]
    assert fig.layout.xaxis.range[1] >= 10.0


def test_the_figure_without_a_prediction_or_any_path():
    measured = path(("compute", 500.0))
    fig = whatif_paths(measured, None)
    assert [list(t.y) for t in fig.data] == [["measured"]] * 4
    empty = whatif_paths(None, None)
    assert not empty.data and "nothing to show" in empty.layout.annotations[0].text


def test_panel_values_as_changes():
    c = whatif_panel.changes(0.5, "0.8", "layers.0.mlp", 0.25, True, None)
    assert (c.comm, c.compute, c.modules, c.balance, c.no_wait) == (0.5, 0.8, (("layers.0.mlp", 0.25),), True, False)
    assert whatif_panel.changes(1, 1, None, 0.5, False, False).none  # no module chosen: its scale is ignored
    for bad in ("", None, -1, "x"):
        with pytest.raises(Exception, match="comm ×: a number >= 0"):
            whatif_panel.changes(bad, 1, None, 1, False, False)


def _post(client, deps, values: dict, changed: str) -> dict:
    cb = next(d for d in deps if "whatif-result.children" in d["output"])
    fill = lambda items: [{**i, "value": values.get(f"{i['id']}.{i['property']}")} for i in items]  # noqa: E731
    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]} for o in cb["output"].strip(".").split("...")]
    body = {"output": cb["output"], "outputs": outputs, "inputs": fill(cb["inputs"]), "state": fill(cb["state"]),
            "changedPropIds": [changed]}  # fmt: skip
    response = client.post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.data[:800]
    return json.loads(response.data)["response"]


def test_the_timeline_panel_replays_the_run_shown():
    app = create_app([RUN])
    a = app.sptrace_store.get(0)
    assert a.replay_graphs  # the dashboard analyses with the whatif part
    options = whatif_panel.module_options(a)
    assert options and options[0]["value"] == "layers.0.attn.qkv"  # the longest module on the path first
    client = app.server.test_client()
    deps = json.loads(client.get("/_dash-dependencies").data)
    values = {"whatif-comm.value": 0.5, "whatif-compute.value": 1, "whatif-module.value": None,
              "whatif-module-scale.value": 1, "whatif-balance.checked": False, "whatif-no-wait.checked": False,
              "header-run.value": "0"}  # fmt: skip
    out = _post(client, deps, values, "whatif-comm.value")
    shown = json.dumps(out["whatif-result"]["children"])
    assert "what if: comm x0.5" in shown and "measured step 74.8 ms" in shown
    assert "+0.0% off the measured step" in shown and "predicted 58.4 ms (-21.9% against the replay)" in shown
    figure = out["whatif-graph"]["figure"]
    transfer = next(t for t in figure["data"] if t["name"] == "transfer")
    assert transfer["y"] == ["measured", "predicted"] and transfer["x"][1] < transfer["x"][0]
    bad = _post(client, deps, {**values, "whatif-compute.value": ""}, "whatif-compute.value")
    assert "compute ×: a number >= 0" in json.dumps(bad["whatif-result"]["children"], ensure_ascii=False)
