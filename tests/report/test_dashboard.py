"""The Dash app, server side: the router over real runs (each page, a broken run's error, the
run in the URL), the page callbacks (clicking a bar filters a table; a zoom goes into the URL),
404s, and apps that share nothing: two in one process, and a slow run that blocks no other."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sptrace.dashboards.app import create_app, parse_view
from sptrace.dashboards.store import RunStore
from sptrace.reference_models.config import StepConfig

from sptrace.cli import build_parser

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    path = tmp_path_factory.mktemp("broken")
    (path / "rank0.json").write_text('{"traceEvents": [')
    return path


@pytest.fixture(scope="module")
def app(profiled, broken):
    return create_app([profiled("megatron"), profiled("megatron-stray-full-save"), broken])


class Client:
    """Posts callbacks as the browser does, from the app's own dependency list."""

    def __init__(self, app):
        self.client = app.server.test_client()
        self.deps = json.loads(self.client.get("/_dash-dependencies").data)

    def call(self, output: str, values: dict, changed: str, match: str | None = None) -> dict:
        """``values``: "id.property" -> value; ``match``: the name a MATCH wildcard stands for."""
        trigger = changed.rsplit(".", 1)[0]
        cb = next(
            d for d in self.deps
            if output in d["output"] and any(json.dumps(i["id"]) == json.dumps(trigger) or i["id"] == trigger
                                             or match is not None for i in d["inputs"])
        )  # fmt: skip

        def concrete(ident):
            if isinstance(ident, str) and ident.startswith("{"):
                ident = json.loads(ident)
            if isinstance(ident, dict):
                return {k: (match if v == ["MATCH"] else v) for k, v in ident.items()}
            return ident

        def spec(text):
            ident, prop = text.rsplit(".", 1)
            return {"id": concrete(ident), "property": prop}

        parts = cb["output"].strip(".").split("...") if cb["output"].startswith("..") else [cb["output"]]
        outputs = [spec(p) for p in parts]

        def fill(items):
            out = []
            for item in items:
                ident = concrete(item["id"])
                key = ident if isinstance(ident, str) else ident["name"]
                out.append({**item, "id": ident, "value": values.get(f"{key}.{item['property']}")})
            return out

        body = {
            "output": cb["output"], "outputs": outputs if len(outputs) > 1 else outputs[0],
            "inputs": fill(cb["inputs"]), "state": fill(cb.get("state", [])), "changedPropIds": [changed],
        }  # fmt: skip
        response = self.client.post("/_dash-update-component", json=body)
        assert response.status_code in (200, 204), response.data[:800]
        return json.loads(response.data)["response"] if response.status_code == 200 else {}

    def page(self, pathname: str, search: str = "", run: str = "0", trigger: str = "url.pathname") -> dict:
        values = {"url.pathname": pathname, "url.search": search, "header-run.value": run, "header-runs.value": None}
        return self.call("page.children", values, trigger)


def text(response) -> str:
    return json.dumps(response, default=str)


def test_layout_header_and_routes(app):
    client = app.server.test_client()
    layout = text(json.loads(client.get("/_dash-layout").data))
    for title in ("Overview", "Timeline", "Collectives", "Memory", "Compare", "GPU (HTA)"):
        assert f'"children": "{title}"' in layout
    assert '"id": "header-run"' in layout and '"id": "header-runs"' in layout  # the selectors live in the header
    for path in ("/", "/timeline", "/collectives?run=1", "/memory?run=2", "/compare?runs=0,2", "/gpu"):
        assert client.get(path).status_code == 200, path
    # a local asset (no CDN): the AG Grid formatters and the stylesheet are served by the app
    assert client.get("/assets/dashAgGridFunctions.js").status_code == 200
    assert b"https://" not in client.get("/").data  # nothing in the page shell points off the machine


def test_parse_view():
    store = RunStore(["a", "b", "c"])
    view = parse_view(store, "/memory", "?run=2&layer=1")
    assert (view.page, view.run, view.runs, view.params) == ("memory", 2, None, {"layer": "1"})
    assert view.chosen(3) == [0, 1, 2] and view.search() == "?run=2&layer=1"
    compare = parse_view(store, "/compare", "?runs=2,0")
    assert compare.runs == [2, 0] and compare.search() == "?run=0&runs=2%2C0"
    assert parse_view(store, "/", "?run=x").run == 0 and parse_view(store, "/nope", "") is None


def test_overview_cards(app, profiled):
    c = Client(app)
    response = c.page("/")
    page = text(response["page"]["children"])
    # a card per run, the broken one with its error; verdict badges carry their status as a class
    assert page.count('"run-card-') == 3
    assert "verdict-badge verdict-pass" in page and "verdict-badge verdict-fail" in page
    assert page.count('"MATCH"') == 1 and page.count('"MISMATCH"') == 1 and page.count('"FAIL"') == 1
    assert "invalid JSON: truncated" in page and "run-error" in page
    # findings grouped across ranks, linking to the page that shows them, for this run
    assert '"ranks 0-7"' in page and "/memory?run=1" in page and "/collectives?run=1" in page
    # the header follows the URL: nav links keep the run, the current page is marked
    assert response["nav-memory"]["href"] == "/memory?run=0" and response["nav-overview"]["className"].endswith(
        "active"
    )  # fmt: skip


def test_overview_numbers_are_transfer_time(app):
    a = app.sptrace_store.get(0)
    facts = a.facts  # the card's numbers
    # communication is transfer time (gloo workers), a large share of a gloo step, never CPU issue time
    issue_ms = a.collectives.groupby("rank")["dur_us"].sum().mean() / 1e3
    assert facts.comm_ms > 3 * issue_ms and 0 < facts.comm_share < 1 and facts.exposed_ms is None
    # wire bytes per rank: what the tensors' own sizes give, summed; the model agrees on a clean run
    assert facts.wire_bytes == pytest.approx(facts.model_wire_bytes)
    layers = a.sharding.layers
    assert facts.retained_per_layer == pytest.approx(layers["measured_bytes"].mean())


def test_collectives_page_and_bar_click_filter(app):
    c = Client(app)
    page = text(c.page("/collectives", "?run=1", run="1")["page"]["children"])
    assert "missing all_gather of 12.00 KiB" in page and "verdict-fail" in page
    assert '"collectives-grid"' in page and '"matched-grid"' in page and '"collectives-bandwidth"' in page
    assert "5184653808097" not in page and '"start_ms"' in page  # ms from the step start, not epoch us
    a = app.sptrace_store.get(1)
    values = {"collectives-wire.clickData": {"points": [{"x": "reduce_scatter"}]}, "header-run.value": "1"}
    out = c.call("collectives-grid", values, "collectives-wire.clickData")
    rows = out['{"name":"collectives-grid","type":"sptrace-grid"}']["rowData"]
    assert len(rows) == (a.collectives["kind"] == "reduce_scatter").sum() > 0
    assert {r["kind"] for r in rows} == {"reduce_scatter"}
    assert all(0 <= r["start_ms"] < 10_000 for r in rows)
    values = {"collectives-layers.clickData": {"points": [{"x": "layer 1", "customdata": "backward"}]},
              "header-run.value": "1"}  # fmt: skip
    out = c.call("collectives-grid", values, "collectives-layers.clickData")
    rows = out['{"name":"collectives-grid","type":"sptrace-grid"}']["rowData"]
    assert rows and {(r["layer"], r["phase"]) for r in rows} == {(1, "backward")}
    assert out["collectives-filter"]["children"] == "showing layer 1, backward"


def test_memory_page_lists_the_tensors_of_a_clicked_bar(app):
    c = Client(app)
    page = text(c.page("/memory", "?run=1", run="1")["page"]["children"])
    assert "FAIL: 1 full-size tensor" in page and "layers.1.mlp.fc1" in page and '"memory-over-step"' in page
    values = {"memory-graph.clickData": {"points": [{"x": "layer 1", "customdata": "full"}]}, "header-run.value": "1"}
    out = c.call("memory-grid", values, "memory-graph.clickData")
    rows = out['{"name":"memory-grid","type":"sptrace-grid"}']["rowData"]
    cfg = StepConfig()
    # the stray save: one full [B*S, H] tensor per rank (the fault's own shape), with who keeps it
    assert len(rows) == 8 and {r["rank"] for r in rows} == set(range(8))
    assert {r["shape"] for r in rows} == {f"{cfg.batch * cfg.seq}×{cfg.hidden}"}
    assert {r["module"] for r in rows} == {"layers.1.mlp.fc1"} and all(r["holder"] for r in rows)
    assert all(r["op"] for r in rows) and all(isinstance(r["alloc_ms"], float) for r in rows)


def test_timeline_zoom_goes_into_the_url(app):
    c = Client(app)
    response = c.page("/timeline", "?run=0&layer=1")
    graph = next(x for x in _walk(response["page"]["children"]) if x.get("props", {}).get("id") == "timeline-graph")
    figure = graph["props"]["figure"]
    a = app.sptrace_store.get(0)
    layer1 = a.collectives[a.collectives["layer"] == 1]
    start = a.clock_ms(layer1["rank"], layer1["transfer_start_us"].fillna(layer1["start_us"]))
    lo, hi = figure["layout"]["xaxis"]["range"]
    assert lo <= start.min() and start.max() < hi and hi - lo < 0.9 * a.facts.step_ms
    out = c.call("url.search", {"timeline-layer.value": "0", "url.search": "?run=0"}, "timeline-layer.value")
    assert out["url"]["search"] == "?run=0&layer=0"
    values = {"timeline-phase.value": "backward", "url.search": "?run=0&layer=0"}
    assert c.call("url.search", values, "timeline-phase.value")["url"]["search"] == "?run=0&phase=backward"


def test_clicking_a_collective_lists_the_events_around_it(app):
    """The drill-down reads that window of the rank's events from the run store: every event
    listed overlaps the clicked collective's transfer (widened a quarter each side)."""
    c = Client(app)
    response = c.page("/timeline", "?run=0")
    graph = next(x for x in _walk(response["page"]["children"]) if x.get("props", {}).get("id") == "timeline-graph")
    bars = next(t for t in graph["props"]["figure"]["data"] if t.get("name") == "reduce_scatter")
    custom = bars["customdata"][2]
    rank, lo_us, hi_us = int(custom[0]), float(custom[12]), float(custom[13])
    out = c.call("timeline-events.children", {"timeline-graph.clickData": {"points": [{"customdata": custom}]},
                                              "header-run.value": "0"}, "timeline-graph.clickData")  # fmt: skip
    grid = next(x for x in _walk(out) if x.get("type") == "AgGrid")
    rows = grid["props"]["rowData"]
    a = app.sptrace_store.get(0)
    pad = max((hi_us - lo_us) * 0.25, 50.0)
    ev = a.run.ranks[rank].events
    ends = ev["ts_ns"] + ev["dur_ns"].fillna(0)
    inside = ev[(ev["ts_ns"] < (hi_us + pad) * 1e3) & (ends >= (lo_us - pad) * 1e3)]
    assert len(rows) == len(inside) > 0 and {r["rank"] for r in rows} == {rank}
    assert sum(r["name"].startswith("gloo:reduce_scatter") or "reduce_scatter" in r["name"] for r in rows) >= 1
    assert f"events on rank {rank}" in json.dumps(out)


def _walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_run_selector_rewrites_the_url(app):
    c = Client(app)
    values = {"url.pathname": "/timeline", "url.search": "?run=0&layer=1", "header-run.value": "1"}
    out = c.call("page.children", {**values, "header-runs.value": None}, "header-run.value")
    assert out["url"]["search"].startswith("?run=1") and "layer" not in out["url"]["search"]
    assert out["nav-memory"]["href"] == "/memory?run=1"


def test_compare_page(app):
    c = Client(app)
    response = c.page("/compare", "?runs=0,1")
    page = response["page"]["children"]
    figure = next(x for x in _walk(page) if x.get("props", {}).get("id") == "compare-runs")["props"]["figure"]
    names = {tuple(t["x"]) for t in figure["data"]}
    assert names == {("megatron", "megatron-stray-full-save")}
    sweep = next(x for x in _walk(page) if x.get("props", {}).get("id") == "compare-sweep")["props"]["figure"]
    assert [t["name"] for t in sweep["data"]] == ["megatron", "ulysses", "hybrid", "ring", "usp (U=2)"]
    # the first chosen run's own model, as its HTML report sweeps it, and said
    assert f"at megatron's model: {app.sptrace_store.get(0).model_sweep.describe()}" in text(page)
    assert "overview-cards" not in text(page)  # no table that repeats the Overview
    assert response["header-runs-wrap"]["style"] == {} and response["header-run-wrap"]["style"] == {"display": "none"}
    assert response["header-runs-label"]["children"] == "2 of 3 runs"


def test_csv_download_on_every_grid(app):
    c = Client(app)
    changed = '{"name":"collectives-grid","type":"sptrace-csv"}.n_clicks'
    out = c.call("exportDataAsCsv", {"collectives-grid.n_clicks": 1}, changed, match="collectives-grid")
    assert next(iter(out.values()))["exportDataAsCsv"] is True


def test_unknown_pages_and_runs_are_404s(tmp_path):
    app = create_app([tmp_path])  # nothing is analysed until a page asks
    client = app.server.test_client()
    for url in ("/no/such/page", "/memory?run=7", "/timeline?run=abc", "/compare?runs=0,9"):
        response = client.get(url)
        assert response.status_code == 404 and b'<a href="/">' in response.data, url
    assert b"serves runs 0 to 0" in client.get("/memory?run=7").data
    assert client.get("/memory?run=0").status_code == 200 and client.get("/_dash-layout").status_code == 200
    response = Client(app).page("/nope")  # followed inside the app: says so, links back
    assert "No such page" in text(response["page"]["children"])


def test_two_apps_in_one_process_share_nothing(profiled, broken):
    first = create_app([profiled("megatron")])
    second = create_app([broken])
    assert "megatron" in text(Client(first).page("/")["page"]["children"])
    assert "invalid JSON" in text(Client(second).page("/")["page"]["children"])
    # creating the second app re-pointed nothing of the first
    page = text(Client(first).page("/")["page"]["children"])
    assert "megatron" in page and "invalid JSON" not in page
    assert first.sptrace_store is not second.sptrace_store


def test_a_slow_run_blocks_no_other(monkeypatch, tmp_path):
    from sptrace.dashboards import store as store_module

    from sptrace import analysis_cache

    release = threading.Event()

    def analyse(path, **options):
        assert "whatif" in options["parts"]  # the Timeline's what-if replays the store's analysis
        if path.name == "slow":
            release.wait(30)
        return f"analysis of {path.name}"

    monkeypatch.setattr(store_module, "analyse_run", analyse)
    monkeypatch.setattr(analysis_cache, "analyse_run", analyse)  # (the store reads kept analyses through it)
    s = RunStore([tmp_path / "slow", tmp_path / "quick"])
    slow = threading.Thread(target=s.get, args=(0,))
    slow.start()
    time.sleep(0.2)
    started = time.monotonic()
    assert s.get(1) == "analysis of quick"  # answered while run 0 is still being analysed
    assert time.monotonic() - started < 5 and slow.is_alive()
    release.set()
    slow.join()
    assert s.get(0) == "analysis of slow"


def test_dash_binds_localhost_by_default():
    args = build_parser().parse_args(["dash", "run"])
    assert args.host == "127.0.0.1" and args.port == 8050 and not args.debug


def test_gpu_page_runs_hta_only_where_there_are_kernels(app, tmp_path):
    from tests.trace_helpers import write_gpu_run

    run = write_gpu_run(tmp_path / "gpu-run")  # a GPU run the test writes itself
    gpu_app = create_app([run])
    page = Client(gpu_app).page("/gpu")["page"]["children"]
    temporal = next(x for x in _walk(page) if x.get("props", {}).get("id") == "gpu-temporal")["props"]["figure"]
    assert [t["name"] for t in temporal["data"]] == ["idle_time", "compute_time", "non_compute_time"]
    assert list(temporal["data"][0]["x"]) == ["rank 0", "rank 1"]
    first = gpu_app.sptrace_store.cached(0, "hta", lambda: None)
    Client(gpu_app).page("/gpu")
    assert first is not None and gpu_app.sptrace_store.cached(0, "hta", lambda: None) is first  # HTA ran once
    assert sorted(p.name for p in run.iterdir()) == ["rank0.json", "rank1.json"]  # HTA wrote nothing beside
    assert "no GPU kernels in this run" in text(Client(app).page("/gpu")["page"]["children"])
    # the overview: transfer time from the NCCL kernels, and the part no compute kernel overlaps,
    # in the step measured (each rank's longest of its two: two all-reduces of 50 + 5*rank us)
    facts = gpu_app.sptrace_store.get(0).facts
    assert facts.comm_ms == pytest.approx(0.105, abs=0.01) and facts.exposed_ms == pytest.approx(0.045, abs=0.01)
    # no run.json: the collectives are checked rank against rank, and the page says why no more
    page = text(Client(gpu_app).page("/collectives")["page"]["children"])
    assert "CONSISTENT: 4 collectives per rank" in page and "the cost model was skipped" in page


def test_debug_mode_only_on_loopback(capsys, tmp_path):
    from sptrace.cli import main

    assert main(["dash", str(tmp_path), "--host", "0.0.0.0", "--debug"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--debug" in err and "0.0.0.0" in err
