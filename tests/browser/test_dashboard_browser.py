"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright):
every page renders without console errors, the run selector and the layer zoom work, and a
broken run shows its error. Screenshots are not kept."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator

import pytest
from sptrace.dashboards.app import create_app
from werkzeug.serving import make_server

pytestmark = pytest.mark.distributed

CHROMIUM = os.environ.get("SPTRACE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip
TIMEOUT_MS = 30_000  # the first plotly render can take 3-12 s on 2 cores (BROWSER-TESTS.md)


@pytest.fixture(scope="module")
def server(profiled, tmp_path_factory) -> Iterator[str]:
    from tests.conftest import CORPUS

    if not os.path.exists(CHROMIUM):
        reason = "no Chromium: set SPTRACE_CHROMIUM=PATH or put chromium on PATH (`make browser` installs Debian's)"
        if os.environ.get("SPTRACE_REQUIRE_BROWSER"):  # CI: the browser must be there
            pytest.fail(reason)
        pytest.skip(reason)
    broken = tmp_path_factory.mktemp("broken")
    (broken / "rank0.json").write_text('{"traceEvents": [')
    from tests.trace_helpers import write_gpu_run

    gpu = write_gpu_run(tmp_path_factory.mktemp("runs") / "gpu-run")  # written here: no corpus needed
    corpus = [CORPUS / "param_dlrm_kineto"] if CORPUS.is_dir() else []
    app = create_app([profiled("megatron"), profiled("megatron-stray-full-save"), broken, gpu, *corpus])
    httpd = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1800, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url, timeout=TIMEOUT_MS)
    return page, errors


@pytest.mark.parametrize(
    "path, marker",
    [
        ("/", "#overview-grid"),
        ("/timeline", "#timeline-graph .main-svg"),
        ("/collectives", "#collectives-wire .main-svg"),
        ("/memory", "#memory-graph .main-svg"),
        ("/compare", "#compare-sweep .main-svg"),
        ("/gpu", "#gpu-body"),
    ],
)
def test_every_page_renders_without_console_errors(browser, server, path, marker):
    page, errors = open_page(browser, server + path)
    page.wait_for_selector(marker, timeout=TIMEOUT_MS)
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
    assert errors == []
    page.close()


def test_broken_run_shows_its_error_and_the_others_work(browser, server):
    page, errors = open_page(browser, server + "/")
    page.wait_for_selector(".run-error", timeout=TIMEOUT_MS)
    assert "invalid JSON" in page.inner_text(".run-error")
    page.wait_for_selector("#overview-grid .ag-row", timeout=TIMEOUT_MS)
    text = page.inner_text("#overview-grid")
    assert "MATCH" in text and "FAIL" in text and "PASS" in text
    assert errors == []


def _choose(page, dropdown_id, label):
    page.click(f"#{dropdown_id}")
    page.locator(".dash-dropdown-option", has_text=label).first.click()


def test_run_selector_and_layer_zoom(browser, server):
    page, errors = open_page(browser, server + "/timeline")
    page.wait_for_selector("#timeline-graph .main-svg", timeout=TIMEOUT_MS)
    # _fullData: plotly.py ships arrays base64-encoded; the decoded ones are here
    plot = "document.querySelector('#timeline-graph .js-plotly-plot')"
    lanes = f"{plot}._fullData.filter(t => t.type === 'bar' && !t.name.endsWith('(phase)'))"
    bars = f"() => {lanes}.reduce((n, t) => n + t.x.length, 0)"  # collectives, not the phase lanes
    page.wait_for_function(f"({bars})() === 168", timeout=TIMEOUT_MS)  # 21 collectives x 8 ranks
    _choose(page, "timeline-layer", "layer 1")
    page.wait_for_function(f"({bars})() === 80", timeout=TIMEOUT_MS)  # layer 1: 10 x 8
    page.goto(server + "/collectives", timeout=TIMEOUT_MS)
    page.wait_for_selector("#collectives-wire .main-svg", timeout=TIMEOUT_MS)
    _choose(page, "collectives-run", "megatron-stray-full-save")
    page.wait_for_selector("text=missing all_gather of 12.00 KiB", timeout=TIMEOUT_MS)
    assert errors == []


def test_gpu_page_on_a_gpu_run(browser, server):
    page, errors = open_page(browser, server + "/gpu")
    page.wait_for_selector(".no-gpu", timeout=TIMEOUT_MS)  # the default run is a gloo CPU run
    _choose(page, "gpu-run", "gpu-run")
    page.wait_for_selector("#gpu-temporal .main-svg", timeout=90_000)  # HTA parses the ranks first
    page.wait_for_selector("#gpu-kernels .ag-row", timeout=TIMEOUT_MS)
    assert "COMMUNICATION" in page.inner_text("#gpu-kernels")
    # the overview shows its exposed communication (a GPU run has streams; the gloo runs say n/a)
    page.goto(server + "/", timeout=TIMEOUT_MS)
    page.wait_for_selector("#overview-grid .ag-row", timeout=TIMEOUT_MS)
    assert "n/a" in page.inner_text("#overview-grid")
    page.goto(server + "/memory", timeout=TIMEOUT_MS)
    page.wait_for_selector("#memory-graph .main-svg, .run-error", timeout=TIMEOUT_MS)
    _choose(page, "memory-run", "gpu-run")  # a trace without a run.json: explained, no crash
    page.wait_for_selector("text=sharding not checked", timeout=TIMEOUT_MS)
    assert "declared neither by run.json nor by a flag" in page.inner_text(".run-error")
    assert errors == []


def test_gpu_page_on_a_corpus_gpu_trace(browser, server):
    from tests.conftest import CORPUS, NO_CORPUS

    if not CORPUS.is_dir():
        if os.environ.get("SPTRACE_REQUIRE_CORPUS"):
            pytest.fail(NO_CORPUS)
        pytest.skip(NO_CORPUS)
    page, errors = open_page(browser, server + "/gpu")
    page.wait_for_selector("#gpu-body", timeout=TIMEOUT_MS)
    _choose(page, "gpu-run", "param_dlrm_kineto")
    page.wait_for_selector("#gpu-temporal .main-svg", timeout=90_000)  # HTA parses 8 ranks first
    page.wait_for_selector("#gpu-kernels .ag-row", timeout=TIMEOUT_MS)
    assert "COMMUNICATION" in page.inner_text("#gpu-kernels")
    assert errors == []
