"""The Dash app, server side: pages, callbacks over real runs, a broken run's error, and only
the runs named on the command line. (Real-browser tests come with the rest of issue 6.)"""

from __future__ import annotations

import json

import dash
import pytest
from sptrace.dashboards.app import create_app
from sptrace.dashboards.pages import compare, memory, overview, timeline

from sptrace.cli import build_parser

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def app(profiled, tmp_path_factory):
    broken = tmp_path_factory.mktemp("broken")
    (broken / "rank0.json").write_text('{"traceEvents": [')
    return create_app([profiled("megatron"), profiled("megatron-stray-full-save"), broken])


def callback(app, output, inputs):
    client = app.server.test_client()
    body = {
        "output": output, "outputs": {"id": output.split(".")[0], "property": output.split(".")[1]},
        "inputs": [{"id": i, "property": "value", "value": v} for i, v in inputs],
        "changedPropIds": [f"{inputs[0][0]}.value"],
    }  # fmt: skip
    response = client.post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.data[:500]
    return json.loads(response.data)


def test_pages_and_layout(app):
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    layout = json.loads(client.get("/_dash-layout").data)
    text = json.dumps(layout)
    for title in ("Overview", "Timeline", "Collectives", "Memory", "Compare"):
        assert f'"children": "{title}"' in text
    assert {p["path"] for p in dash.page_registry.values()} >= {"/", "/timeline", "/collectives", "/memory", "/compare"}


def test_overview_rows_and_the_broken_run(app):
    table = overview.summary(app.sptrace_store)
    rows = table.to_dict(orient="records")
    assert rows[0]["collectives"] == "MATCH" and rows[0]["sharding"] == "PASS" and rows[0]["ranks"] == "8 / 8"
    # communication is transfer time (gloo workers), a large share of a gloo step, never CPU issue time
    a = app.sptrace_store.get(0)
    issue_ms = a.collectives.groupby("rank")["dur_us"].sum().mean() / 1e3
    assert rows[0]["comm ms (transfer, mean)"] > 3 * issue_ms
    assert 0 < rows[0]["comm %"] < 100 and rows[0]["exposed comm ms"] == "n/a"
    assert rows[1]["collectives"] == "MISMATCH" and rows[1]["sharding"] == "FAIL"
    assert "invalid JSON: truncated" in rows[2]["error"]
    rendered = json.dumps(overview.layout(app.sptrace_store).to_plotly_json(), default=str)
    assert "run-error" in rendered and "invalid JSON" in rendered


def test_collectives_callback(app):
    out = json.dumps(callback(app, "collectives-body.children", [("collectives-run", 1)]))
    assert "collectives-grid" in out and "matched-grid" in out and "missing all_gather of 12.00 KiB" in out
    broken = json.dumps(callback(app, "collectives-body.children", [("collectives-run", 2)]))
    assert "invalid JSON" in broken
    assert "no such run" in json.dumps(callback(app, "collectives-body.children", [("collectives-run", 99)]))


def test_timeline_zooms_to_a_layer(app):
    options = timeline.layer_options(app.sptrace_store, 0)
    assert [o["value"] for o in options] == ["all", 0, 1]
    whole = timeline.view(app.sptrace_store, 0).figure
    one = timeline.view(app.sptrace_store, 0, 1).figure
    lanes = lambda fig: [t for t in fig.data if t.type == "bar" and not t.name.endswith("(phase)")]  # noqa: E731
    bars = lambda fig: sum(len(t.x) for t in lanes(fig))  # noqa: E731
    assert bars(whole) == 21 * 8 and bars(one) == 10 * 8
    # a compute lane per rank: its forward, backward and optimizer phases
    phases = [t for t in whole.data if t.name.endswith("(phase)")]
    assert sorted(t.name for t in phases) == ["backward (phase)", "forward (phase)", "optimizer (phase)"]
    assert all(len(t.x) == 8 for t in phases) and not any(t.name.endswith("(phase)") for t in one.data)
    (links,) = [t for t in whole.data if t.name == "same collective"]
    assert list(links.x).count(None) == 21  # one line per matched collective, through its 8 ranks
    assert len(links.x) == 21 * 9
    out = callback(app, "timeline-body.children", [("timeline-run", 0), ("timeline-layer", 1)])
    assert "timeline-graph" in json.dumps(out)


def test_memory_and_compare(app):
    parts = memory.view(app.sptrace_store, 1)
    text = json.dumps([p.to_plotly_json() for p in parts], default=str)
    assert "FAIL: 1 full-size tensors kept for backward" in text and "ranks 0-7: layers.1.mlp.fc1" in text
    over_step = next(p for p in parts if getattr(p, "id", None) == "memory-over-step").figure
    assert [t.name for t in over_step.data] == [f"rank {r}" for r in range(8)]
    sweep = compare.layout(app.sptrace_store).children[-1].figure
    assert [t.name for t in sweep.data] == ["megatron", "ulysses", "hybrid"]


def test_dash_binds_localhost_by_default():
    args = build_parser().parse_args(["dash", "run"])
    assert args.host == "127.0.0.1" and args.port == 8050 and not args.debug


def test_gpu_page_runs_hta_only_where_there_are_kernels(app, tmp_path):
    from sptrace.dashboards.app import create_app
    from sptrace.dashboards.pages import gpu

    from tests.trace_helpers import write_gpu_run

    run = write_gpu_run(tmp_path / "gpu-run")  # a GPU run the test writes itself
    gpu_app = create_app([run])
    parts = gpu.view(gpu_app.sptrace_store, 0)
    temporal = parts[0].figure
    assert [t.name for t in temporal.data] == ["idle_time", "compute_time", "non_compute_time"]
    assert list(temporal.data[0].x) == ["rank 0", "rank 1"]
    total = [sum(t.y[i] for t in temporal.data) for i in range(2)]
    assert all(abs(s - 100) < 1 for s in total)  # shares of each rank's GPU time
    first = gpu_app.sptrace_store.cached(0, "hta", lambda: None)
    gpu.view(gpu_app.sptrace_store, 0)
    assert first is not None and gpu_app.sptrace_store.cached(0, "hta", lambda: None) is first  # HTA ran once
    assert sorted(p.name for p in run.iterdir()) == ["rank0.json", "rank1.json"]  # HTA wrote nothing beside
    message = json.dumps(gpu.view(app.sptrace_store, 0)[0].to_plotly_json())
    assert "no GPU kernels in this run" in message
    # the overview: transfer time from the NCCL kernels, and the part no compute kernel overlaps
    row = overview.summary(gpu_app.sptrace_store).iloc[0]
    assert row["comm ms (transfer, mean)"] == pytest.approx(0.2, abs=0.05)
    assert row["exposed comm ms"] == pytest.approx(0.1, abs=0.05)


def test_an_unknown_url_is_a_404_that_links_back(tmp_path):
    app = create_app([tmp_path])  # nothing is analysed until a page asks
    client = app.server.test_client()
    response = client.get("/no/such/page")
    assert response.status_code == 404 and b'<a href="/">' in response.data
    assert client.get("/memory").status_code == 200 and client.get("/_dash-layout").status_code == 200


def test_debug_mode_only_on_loopback(capsys, tmp_path):
    from sptrace.cli import main

    assert main(["dash", str(tmp_path), "--host", "0.0.0.0", "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--debug" in err and "0.0.0.0" in err
