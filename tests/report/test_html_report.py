"""`sptrace report`: one self-contained HTML file over several runs; a broken run shows its
error and the others still render. Its tables read like the dashboard's, each run's cost model is
swept at that run's own model, and an 8-rank run's report stays under 1.5 MiB with plotly.js
packed inside. (Tests that read a profiled run are marked `distributed` by their fixture.)"""

from __future__ import annotations

import base64
import json
import lzma
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sptrace.cli import main
from sptrace.report.html import B85_ALPHABET, MEMORY_POINTS, render_html_table

SCIENTIFIC = re.compile(r"(?<![\w#.])\d+(?:\.\d+)?[eE][+-]?\d+(?!\w)")
"""A number in scientific notation (2.76e+04, 5e12), not a colour's digits (#2f9e44)."""
_RFC1924 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"


def unpack(page: str, element_id: str) -> bytes:
    """A packed element of the page, decoded as its loader does: base85 digits, then LZMA."""
    found = re.search(rf'<script [^>]*id="{element_id}" data-bytes="(\d+)">([^<]*)</script>', page)
    assert found, f"no {element_id} in the page"
    packed = base64.b85decode(found.group(2).encode().translate(bytes.maketrans(B85_ALPHABET, _RFC1924)))
    data = lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(packed)
    assert len(data) == int(found.group(1))
    return data


def readable(page: str) -> str:
    """The page with each packed element (base85 digits of LZMA bytes) replaced by what it holds:
    what a reader can see, without the packed digits, in which any short text turns up by chance."""
    ids = re.findall(r'<script [^>]*id="([^"]+)" data-bytes="\d+">', page)
    unpacked = {i: unpack(page, i).decode() for i in ids}
    return re.sub(
        r'(<script [^>]*id="([^"]+)" data-bytes="\d+">)[^<]*(</script>)',
        lambda m: m.group(1) + unpacked[m.group(2)] + m.group(3),
        page,
    )


def without_scripts(page: str) -> str:
    return re.sub(r"<script.*?</script>", "", page, flags=re.S)


def test_report_over_runs(profiled, tmp_path, capsys):
    from tests.suite import CORPUS

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rank0.json").write_text('{"traceEvents": [')
    out = tmp_path / "out" / "report.html"
    dlrm = CORPUS / "param_dlrm_kineto"
    args = [str(profiled("megatron")), str(profiled("megatron-stray-full-save")), str(broken)]
    args += [str(dlrm)] if dlrm.is_dir() else []
    assert main(["report", *args, "--html", str(out)]) == 0
    page = out.read_text()
    # the index as text (badges are coloured spans: green for MATCH/PASS, red for MISMATCH/FAIL)
    text = re.sub(r"<span [^>]*>([^<]*)</span>", r"\1", page)
    assert re.search(r'megatron</a>: collectives <span class="badge verdict-pass" style="background:#2f9e44"', page)
    assert 'class="badge verdict-fail" style="background:#e03131"' in page
    assert page.count("* plotly.js v") == 1 and page.count('id="sptrace-plotly"') == 1  # plotly.js inlined once
    assert page.count('class="plotly-graph-div"') >= 3 * 2 + 1
    assert "megatron</a>: collectives MATCH; sharding PASS" in text
    assert "megatron-stray-full-save</a>: collectives MISMATCH; sharding FAIL" in text
    # a finding on every rank is one row with its rank set
    assert page.count("layers.1.mlp.fc1 keeps a full-sequence [256x96]") == 1 and "ranks 0-7" in page
    assert "communication" in page and "of transfer time" in page
    assert "layers.1.mlp.fc1 keeps a full-sequence [256x96]" in page
    if dlrm.is_dir():
        # a foreign run that declares nothing: its ranks are compared with each other, and the
        # sharding check does not run; each says so
        assert "param_dlrm_kineto</a>: collectives CONSISTENT; sharding NOT CHECKED" in text
        assert "the cost model was skipped: the cost model needs --scheme" in page
    assert "broken</a>: unusable" in page and "invalid JSON: truncated" in page
    # the cost model is swept at each run's own model, and only where the run declares all of it
    sweeps = re.findall(r"<h3>the cost model across sequence lengths at the model of this run: ([^<]*)</h3>", page)
    assert sweeps == ["megatron P=8 L=2 B=2 S=128 H=96 a=16 g=8 F=160 float32, S varied"] * 2, sweeps
    assert "3.6B" not in readable(page) and "seed-3.6b" not in page
    assert not list(out.parent.glob(".*"))
    assert main(["report", str(tmp_path / "missing"), "--html", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    # nothing could be analysed: exit 2, and no report of errors is written
    lone = tmp_path / "lone.html"
    assert main(["report", str(broken), "--html", str(lone)]) == 2
    assert "no run could be analysed" in capsys.readouterr().err and not lone.exists()


def test_tables_read_like_the_dashboard():
    # GIVEN matched collectives as the detector leaves them: absolute starts on a rank's own clock
    # (~5e12 us), durations in us, bytes, a layer kept float around a null, rank lists
    frame = pd.DataFrame({
        "kind": ["all_gather", "all_reduce"], "ranks": [list(range(8)), [0, 1, 2, 5]],
        "wire_bytes": [86016.0, 1536.0], "layer": [0.0, np.nan], "start_us": [5.16e12, 5.16e12 + 27612.0],
        "transfer_us": [27612.0, 1234567.0], "algbw_gbps": [0.004448, 12.5], "straggler": [3, 0],
    })  # fmt: skip
    # WHEN the report renders it
    table = render_html_table(frame, "matched")
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(<td.*?)</tr>", table)]
    # THEN the dashboard's headers, human units, whole numbers as integers, no absolute times
    assert heads == ["kind", "ranks", "on the wire", "layer", "transfer (ms)", "algbw (GB/s)", "straggler"]
    assert rows == [
        ["all_gather", "0-7", "84.00 KiB", "0", "27.612", "0.004", "3"],
        ["all_reduce", "0-2, 5", "1.50 KiB", "", "1234.567", "12.500", "0"],
    ]


@pytest.fixture(scope="module")
def megatron_report(profiled, tmp_path_factory) -> Path:
    """`sptrace report` over the demo's 8-rank megatron run alone."""
    out = tmp_path_factory.mktemp("report") / "megatron.html"
    assert main(["report", str(profiled("megatron")), "--html", str(out)]) == 0
    return out


def test_report_of_an_8_rank_run(megatron_report):
    page = megatron_report.read_text()
    # small: plotly.js (4.6 MiB) packed once, under 1.5 MiB in all (4.9 MiB before)
    assert megatron_report.stat().st_size < 1.5 * 2**20
    import plotly.offline

    assert unpack(page, "sptrace-plotly").decode() == plotly.offline.get_plotlyjs()
    plots = json.loads(unpack(page, "sptrace-figures"))
    assert len(plots) == page.count('class="plotly-graph-div"') == 6
    memory = next(p for p in plots if p["layout"]["title"]["text"] == "allocated memory over the step")
    points = [len(base64.b64decode(t["x"]["bdata"])) // np.dtype(t["x"]["dtype"]).itemsize for t in memory["data"]]
    assert len(points) == 8 and max(points) <= MEMORY_POINTS  # thinned for the page: min and max per time bin
    # tables: the dashboard's headers, never an exponent or a raw clock reading
    text = without_scripts(page)
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", text)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", text)
    assert {"on the wire", "issued (ms)", "transfer (ms)", "arrival skew (ms)", "measured wire"} <= set(heads)
    assert not [h for h in heads if "_" in h], heads
    assert not SCIENTIFIC.search(text), SCIENTIFIC.findall(text)
    numbers = [float(c) for c in cells if re.fullmatch(r"-?\d+(\.\d+)?", c)]
    assert numbers and max(numbers) < 1e6  # ms from the step start, not the rank's clock in us
    assert "84.00 KiB" in cells
    # the sweep: this run's model (S=128, H=96), not a preset's
    sweep = "<h3>the cost model across sequence lengths at the model of this run: megatron P=8 L=2 B=2 S=128 H=96"
    assert text.count(sweep) == 1
    assert "3.6B" not in readable(page) and "seed-3.6b" not in page


CHROMIUM = os.environ.get("SPTRACE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.browser
def test_report_plots_render_offline(megatron_report):
    """The packed plotly.js unpacks in a real browser, with no network: every plot is drawn, and
    hovering a collective shows its hover text."""
    if not os.path.exists(CHROMIUM):
        reason = "no Chromium: set SPTRACE_CHROMIUM=PATH or put chromium on PATH (`make browser` installs Debian's)"
        if os.environ.get("SPTRACE_REQUIRE_BROWSER"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync"]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=flags)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            fetched: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: fetched.append(r.url))
            page.goto(megatron_report.as_uri())
            n = page.locator("div.plotly-graph-div").count()
            # the first render can take 3-12 s on 2 cores (BROWSER-TESTS.md)
            page.wait_for_function(f"document.querySelectorAll('div.plotly-graph-div .main-svg').length >= {n}",
                                   timeout=30_000)  # fmt: skip
            assert n == 6 and page.locator(".plotly-graph-div.error").count() == 0
            first = page.evaluate("""() => [...document.querySelectorAll('#plot0 .trace.bars')]
                .findIndex(t => t.__data__ && t.__data__[0].trace.customdata)""")  # a collective's (phases first)
            assert first >= 0
            bar = page.locator("#plot0 .trace.bars").nth(first).locator(".point").first
            hover = page.locator("#plot0 .hoverlayer .hovertext").first
            # a move that lands while plotly still lays the figure out is lost (as clicks are,
            # tests/browser): move off and onto the bar again, up to three times
            for attempt in range(3):
                box = bar.bounding_box()
                assert box is not None
                page.mouse.move(1, 1)
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                try:
                    hover.wait_for(timeout=5_000)
                    break
                except PlaywrightTimeout:
                    if attempt == 2:
                        raise
            assert "wire" in hover.text_content() and "matched with ranks" in hover.text_content()
            assert errors == [] and [u for u in fetched if not u.startswith("file:")] == []
        finally:
            browser.close()
