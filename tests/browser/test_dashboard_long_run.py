"""The dashboard over a long run, in a real headless Chromium: a 2-rank golden run's window repeated
COPIES times (benchmarks/synth_run.py --repeat), served with the Timeline capped at CAP points.

- With the run's analysis kept on disk by an earlier dashboard (sptrace.analysis_cache), a new
  server draws the Overview within FIRST_PAGE_S of the click.
- The Timeline sends at most CAP points (counted in the browser, in the figure plotly holds) while
  the run has more collectives than that: it is decimated, and says so.
- Zooming (a relayout of the x axis, as a drag does) fetches that window's detail: more collective
  bars inside the window than the whole view had there, still at most CAP points.

Without Chromium every test skips with one reason (SPTRACE_REQUIRE_BROWSER=1 makes that a failure)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("SPTRACE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip
SOURCE = ROOT / "tests" / "golden" / "runs" / "megatron"
COPIES = 40
"""880 collectives and 960 compute intervals on 2 ranks (21 MB of JSON a rank; 3 s to analyse)."""
CAP = 600
"""The Timeline's budget here: below the run's collectives alone, so that it must decimate."""
FIRST_PAGE_S = 3.0
TIMEOUT_MS = 60_000

POINTS = """() => {
    const gd = document.querySelector('#timeline-graph .js-plotly-plot');
    if (!gd || !gd.data) return null;
    // an array as sent: a list, or plotly.py's base64 typed array ({dtype: 'f8', bdata})
    const n = t => !t.x ? 0 : t.x.bdata !== undefined ? atob(t.x.bdata).length / parseInt(t.x.dtype.slice(1))
                               : t.x.length;
    return {
        points: gd.data.reduce((s, t) => s + n(t), 0),
        shapes: (gd.layout.shapes || []).length,
        meta: gd.layout.meta,
        bars: gd.data.filter(t => t.customdata && t.type === 'bar').reduce((s, t) => s + n(t), 0),
    };
}"""
SENT = """() => performance.getEntriesByType('resource')
    .filter(e => e.name.includes('_dash-update-component')).map(e => e.encodedBodySize)"""
WINDOW_FETCHED = """w => {
    const m = document.querySelector('#timeline-graph .js-plotly-plot').layout.meta, d = w[1] - w[0];
    return m && m.window_ms[0] > w[0] - d && m.window_ms[1] < w[1] + d;
}"""
DEBUG = """() => { const gd = document.querySelector('#timeline-graph .js-plotly-plot');
    return [gd.layout.meta, gd.layout.xaxis.range, gd._fullLayout.xaxis.range]; }"""
INSIDE = """([lo, hi]) => {
    const gd = document.querySelector('#timeline-graph .js-plotly-plot');
    return gd._fullData.filter(t => t.customdata && t.type === 'bar')
        .reduce((s, t) => s + [...t.base].filter(b => b >= lo && b <= hi).length, 0);
}"""


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> Path:
    if not os.path.exists(CHROMIUM):
        reason = "no Chromium: set SPTRACE_CHROMIUM=PATH or put chromium on PATH (`make browser` installs Debian's)"
        if os.environ.get("SPTRACE_REQUIRE_BROWSER"):  # CI: the browser must be there
            pytest.fail(reason)
        pytest.skip(reason)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from synth_run import write_lengthened

    out = tmp_path_factory.mktemp("long") / "megatron-x40"
    write_lengthened(SOURCE, COPIES, out)
    return out


@pytest.fixture(scope="module")
def served(long_run) -> Iterator[tuple[str, object]]:
    """A server whose store has nothing in memory, over the long run (1) and the golden one (0),
    after an earlier dashboard analysed both and kept them on disk."""
    from sptrace.dashboards.app import create_app
    from werkzeug.serving import make_server

    earlier = create_app([SOURCE, long_run])
    for i in range(2):
        assert type(earlier.sptrace_store.get(i)).__name__ == "RunAnalysis"
    app = create_app([SOURCE, long_run], timeline_points=CAP)
    httpd = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", earlier.sptrace_store.get(1)
    httpd.shutdown()


@pytest.fixture(scope="module")
def page(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.errors = errors
        yield tab
        browser.close()


def test_first_page_within_budget_with_the_analysis_cached(page, served):
    base, _ = served
    # the page's scripts once (the golden run's Timeline: the long run is not read), as a returning user has them
    page.goto(base + "/timeline?run=0", timeout=TIMEOUT_MS)
    page.wait_for_selector("#timeline-graph .main-svg", timeout=TIMEOUT_MS)
    t = time.perf_counter()
    page.goto(base + "/", timeout=TIMEOUT_MS)
    page.wait_for_selector("#step-1", timeout=TIMEOUT_MS)  # the long run's card, read back from the disk cache
    took = time.perf_counter() - t
    assert took <= FIRST_PAGE_S, f"the Overview took {took:.2f} s with the analysis cached"
    assert page.errors == []


def test_the_timeline_is_decimated_under_the_cap_and_zoom_fetches_detail(page, served):
    base, analysis = served
    assert len(analysis.collectives) > CAP  # more collectives than the cap: decimation has to happen
    page.goto(base + "/timeline?run=1", timeout=TIMEOUT_MS)
    page.wait_for_selector("#timeline-graph .barlayer .point path", timeout=TIMEOUT_MS)
    whole = page.evaluate(POINTS)
    assert whole["points"] <= CAP and whole["shapes"] == 0, whole
    assert whole["meta"]["decimated"] and whole["bars"] < len(analysis.collectives)
    assert "zoom in" in page.text_content("#timeline-graph .gtitle")
    sent = page.evaluate(SENT)  # the callbacks' responses: the page, its figure and grids
    assert 0 < sum(sent) < 1_000_000, sent
    # zoom to a twentieth of the step: the server sends that window's detail
    lo, hi = whole["meta"]["extent_ms"]
    window = [lo + (hi - lo) * 0.40, lo + (hi - lo) * 0.45]
    before = page.evaluate(INSIDE, window)
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)  # the page's own callbacks answered
    page.evaluate("w => Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'), "
                  "{'xaxis.range': w})", window)  # fmt: skip
    try:
        page.wait_for_function(WINDOW_FETCHED, arg=window, timeout=TIMEOUT_MS)
    except Exception:
        print("relayoutData", page.evaluate(DEBUG))
        raise
    zoomed = page.evaluate(POINTS)
    after = page.evaluate(INSIDE, window)
    assert zoomed["points"] <= CAP, zoomed
    assert after > before, (before, after)
    # the zoom held: the range shown is the window asked for
    shown = page.evaluate("() => document.querySelector('#timeline-graph .js-plotly-plot').layout.xaxis.range")
    assert shown == pytest.approx(window, rel=1e-6)
    # zooming all the way out fetches the whole step again
    page.evaluate("() => Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'), "
                  "{'xaxis.autorange': true})")  # fmt: skip
    page.wait_for_function("() => document.querySelector('#timeline-graph .js-plotly-plot').layout.meta.window_ms[1]"
                           " - document.querySelector('#timeline-graph .js-plotly-plot').layout.meta.window_ms[0]"
                           f" > {0.9 * (hi - lo)}", timeout=TIMEOUT_MS)  # fmt: skip
    assert page.evaluate(POINTS)["points"] <= CAP
    assert page.errors == []
