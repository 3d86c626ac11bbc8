"""A self-contained HTML report over one or several runs, readable offline (a CI artifact). It
renders finished analyses (sptrace.analysis's RunAnalysis, which the CLI runs), as the dashboard
does, and computes nothing of its own; the figures come from sptrace.report's figure modules,
shared with the dashboard, and the tables read like the dashboard's grids: its headers, bytes in
KiB/MiB/GiB, times in ms from the step start.

Size: plotly.js (4.6 MiB) is inlined once, LZMA-compressed and base85-encoded (1.3 MiB), and the
figures' data likewise; a decoder in the page unpacks both when it opens, so that an 8-rank
report stays under 1.5 MiB. Gzip would let the browser's own DecompressionStream unpack it, but
plotly.js gzipped is 1.4 MiB, 1.9 MiB in base64; a page has no built-in LZMA, hence the decoder.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import html
import lzma
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from sptrace import __version__
from sptrace.analysis import RunAnalysis
from sptrace.checks.findings import Finding, Verdict
from sptrace.report import compare, figures, timeline
from sptrace.report.html_page import B85_ALPHABET, LOADER, PAGE
from sptrace.report.theme import FONT, VERDICT_COLORS, header
from sptrace.vocab.errors import SptraceError
from sptrace.vocab.units import human_bytes, human_ms, rank_ranges

Cell = TypeVar("Cell")
"""A table cell's value, as its column's formatter takes it."""

MEMORY_POINTS = 1000
"""Points per rank of the memory plot: min and max of 500 time bins keep every peak of a plot
about 1000 px wide (the dashboard draws 4000, which made the figure 190 KiB of an 8-rank report)."""


def render_html(runs: Sequence[tuple[Path, RunAnalysis | SptraceError]]) -> str:
    """The page over ``runs``: each run's path with its analysis, or the error that made it
    unusable (sptrace.analysis.try_analyse's)."""
    sections, index, plots = [], [], []
    for i, (path, a) in enumerate(runs):
        name = html.escape(str(path))
        if not isinstance(a, RunAnalysis):
            sections.append(f'<section id="run{i}"><h2>{name}</h2><p class="error">{html.escape(str(a))}</p></section>')
            index.append(f'<li><a href="#run{i}">{name}</a>: unusable</li>')
            continue
        verdicts = tuple((name, r.verdict, r.unavailable) for name, r in a.reports.items())
        badges = "; ".join(f"{check} {badge(check, verdict, why)}" for check, verdict, why in verdicts)
        index.append(f'<li><a href="#run{i}">{name}</a>: {badges}</li>')
        sections.append(_run_section(f"run{i}", name, a, verdicts, plots))
    banner, plotly_js = _plotly()
    return PAGE.format(
        font=FONT,
        version=__version__, created=time.strftime("%Y-%m-%d %H:%M"), index="\n".join(index),
        sections="\n".join(sections), plotly=plotly_js, banner=banner, loader=LOADER,
        figures=_packed("sptrace-figures", ("[" + ",".join(plots) + "]").encode()),
    )  # fmt: skip


def _run_section(
    anchor: str, name: str, a: RunAnalysis, verdicts: tuple[tuple[str, Verdict | None, str | None], ...],
    plots: list[str],
) -> str:  # fmt: skip
    def plot(fig: go.Figure) -> str:
        return _plot(fig, plots)

    run, model = a.run, a.model
    parts = [f'<section id="{anchor}"><h2>{name}</h2>']
    desc = f"{len(run)} of {run.world_size} ranks, backend {run.backend or 'unknown'}; "
    desc += f"{model.label} {model.describe()}"
    parts.append(html_p(desc))
    for label, verdict, why in verdicts:
        line = verdict.line() if verdict is not None else f"not checked: {why}"
        if label == "collectives" and a.comm is None and verdict is not None:
            line += f" (ranks compared with each other; the cost model was skipped: {why})"
        parts.append(f'<p class="verdict">{badge(label, verdict, why)} {html.escape(label)}: {html.escape(line)}</p>')
    t = a.facts
    if t.step_ms is not None:
        exposed = "n/a (no GPU streams)" if t.exposed_ms is None else human_ms(t.exposed_ms)
        share = "" if t.comm_share is None else f" ({100 * t.comm_share:.0f}% of the step)"
        parts.append(html_p(
            f"step {t.step_ms:.1f} ms (slowest rank, measured by {t.step_source}); communication "
            f"{t.comm_ms or 0:.1f} ms of transfer time per rank{share}; exposed {exposed}"
        ))  # fmt: skip
    parts.append(plot(timeline.timeline(a)))
    parts += _critical_path(a)
    parts.append(plot(figures.wire_by_kind(a)))
    parts.append(plot(figures.wire_by_layer(a)))
    if a.p2p is not None and not a.p2p.pairs.empty:
        parts.append(plot(timeline.p2p_matrix(a)))
        parts.append(plot(timeline.p2p_steps(a)))
    if a.comm is not None:
        parts.append(_findings_table("collective findings", a.comm.findings))
        parts.append(render_html_table(a.comm.ranks, "per rank: collectives and wire bytes against the model"))
    elif a.crossrank is not None:
        parts.append(_findings_table("cross-rank findings", a.crossrank.findings))
        parts.append(render_html_table(a.crossrank.ranks, "per rank: collectives and wire bytes"))
    if a.sharding is not None:
        parts.append(plot(figures.retained_by_layer(a.sharding.saved, a.expected_activation_bytes)))
        parts.append(plot(figures.memory_over_step(a, max_points=MEMORY_POINTS)))
        parts.append(_findings_table("sharding findings", a.sharding.findings))
        parts += [html_p(f"note: {n}") for n in a.sharding.notes]
        parts += _projection(a)
    for r in a.reports.values():  # the registered checks (the run's own two are drawn above)
        if r.name not in ("collectives", "sharding"):
            parts.append(_findings_table(f"{r.title} ({r.name}) findings", list(r.findings)))
            parts += [html_p(f"note: {n}") for n in r.notes]
    matched = _matched_rows(a)
    if len(matched):
        total = len(a.matching.matched) if a.matching is not None else 0
        first = f" (the first {len(matched)} of {total})" if total > len(matched) else ""
        title = f"matched collectives{first}: skew, straggler, bandwidth; times in ms from the step start, on clocks "
        parts.append(render_html_table(matched, title + "aligned across ranks"))
    sweep = a.model_sweep
    if sweep is not None:
        parts.append(html_h3(f"the cost model across sequence lengths at the model of this run: {sweep.describe()}"))
        parts.append(plot(compare.model_sweep(a)))
    for w in a.warnings:
        parts.append(f'<p class="warning">{html.escape(w)}</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _projection(a: RunAnalysis) -> list[str]:
    """The kept bytes at the production shape (--at, a production: block), where one is declared."""
    p = a.projection
    if p is None:
        return []
    korthikanti = (human_bytes(p.korthikanti_per_layer) if p.korthikanti_per_layer is not None
                   else f"unknown, {p.korthikanti_why}")  # fmt: skip
    parts = [
        html_h3(f"kept for backward at production size: {p.headline()}"),
        html_p(f"Korthikanti et al. at this shape: {korthikanti} per layer and rank. Each dimension of each kept "
               "tensor is scaled by what it is (B, S, S/P, H, F/P, a/P, d); a tensor whose dimensions cannot be "
               "named is carried as measured and listed."),
        render_html_table(p.rank_rows(), "per rank, the boundary that kept the most: measured and at production"),
    ]  # fmt: skip
    if p.fails:
        parts.append(render_html_table(p.fail_rows(), "each FAIL's bytes over a 1/P shard, at production"))
    parts += [html_p(f"note: {n}") for n in p.notes]
    return parts


def _critical_path(a: RunAnalysis) -> list[str]:
    """The critical path's culprit, its time by kind and by module (the timeline's red line)."""
    path = a.critical_path
    if path is None or path.step_us <= 0:
        return []
    steps = [render_html_table(path.step_table(), f"each profiled step's path ({path.step}'s above)")]
    sequence = path.sequence()
    title = "the path in order"
    if len(sequence) > SEQUENCE_ROWS:
        title += f" (the first {SEQUENCE_ROWS} of {len(sequence)}; analyze --format json lists every segment)"
    return [
        html_h3("critical path"),
        html_p(f"{path.headline()}; {path.kinds_text()}"),
        render_html_table(path.module_table(20), "time on the critical path by module"),
        *(steps if path.steps else []),
        render_html_table(sequence.head(SEQUENCE_ROWS), title),
    ]


SEQUENCE_ROWS = 200
"""The report lists the critical path's first segments (a GPU step's path holds thousands)."""


def _matched_rows(a: RunAnalysis, limit: int = 200) -> pd.DataFrame:
    """The matched collectives as the dashboard's grid shows them: the ranks as a range, times
    from the step start on aligned clocks (the rank's own clock's absolute times say nothing)."""
    m = a.matching.matched.head(limit) if a.matching is not None else pd.DataFrame()
    if m.empty:
        return m
    return pd.DataFrame({
        "kind": m["kind"], "phase": m["phase"], "layer": m["layer"], "module": m["module"],
        "ranks": m["ranks"].map(rank_ranges), "in_bytes": m["in_bytes"], "wire_bytes": m["wire_bytes"],
        "start_ms": (m["start_us"] - a.step_zero_us) / 1e3, "arrival_skew_ms": m["arrival_skew_us"] / 1e3,
        "straggler": m["straggler"], "transfer_ms": m["transfer_us"] / 1e3, "algbw_gbps": m["algbw_gbps"],
        "busbw_gbps": m["busbw_gbps"],
    })  # fmt: skip


def badge(check: str, verdict: Verdict | None, why: str | None = None) -> str:
    """The dashboard's verdict badge: same labels and colours, the reasons on hover."""
    if verdict is None:
        status, label, tip = "unavailable", "NOT CHECKED", f"{check} not checked: {why or 'no data'}"
    else:
        status, label = verdict.status, verdict.label
        tip = "\n".join([verdict.summary, *verdict.reasons])
    return (f'<span class="badge verdict-{status}" style="background:{VERDICT_COLORS[status]}" '
            f'title="{html.escape(tip)}">{html.escape(label)}</span>')  # fmt: skip


def html_p(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def html_h3(text: str) -> str:
    return f"<h3>{html.escape(text)}</h3>"


# ---- tables ------------------------------------------------------------------------------------


def render_html_table(frame: pd.DataFrame, title: str) -> str:
    """``frame`` as the dashboard's grids show it: its headers (theme.HEADERS), bytes in
    KiB/MiB/GiB, ``_ms`` and ``_gbps`` with 3 decimals, counts as integers, never an exponent.
    Durations in us show in ms; absolute times in us (a rank's own clock, ~5e12) are left out."""
    shown = frame.copy()
    for col in [str(c) for c in shown.columns if str(c).endswith("_us")]:
        at, values, ms = shown.columns.get_loc(col), shown.pop(col), col.removesuffix("_us") + "_ms"
        absolute = col in ("ts_us", "end_us") or "start" in col
        if not absolute and ms not in shown:  # a duration: in ms, in its place
            shown.insert(at, ms, pd.to_numeric(values, errors="coerce") / 1e3)
    cells = {col: _cells(shown[col], str(col)) for col in shown.columns}
    numeric = {col: _is_number(shown[col]) for col in shown.columns}
    head = "".join(f"<th{_num(numeric[c])}>{html.escape(header(str(c)))}</th>" for c in shown.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td{_num(numeric[c])}>{html.escape(cells[c][i])}</td>" for c in shown.columns) + "</tr>"
        for i in range(len(shown))
    )
    return f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{rows}</table>"


def _num(numeric: bool) -> str:
    return ' class="num"' if numeric else ""


def _is_number(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


def _cells(values: pd.Series, col: str) -> list[str]:
    """A column's cells as text: bytes in binary units, times and bandwidths to 3 decimals, whole
    numbers (a count, a rank, a layer; pandas keeps them float around nulls) as integers."""
    if col.endswith("bytes"):
        return [_text(v, lambda x: human_bytes(float(x))) for v in values]
    if col.endswith(("_ms", "_gbps")):
        return [_text(v, lambda x: f"{float(x):.3f}") for v in values]
    if _is_number(values):
        known = pd.to_numeric(values, errors="coerce").dropna()
        whole = bool(np.isfinite(known).all() and (known == known.round()).all())
        return [_text(v, (lambda x: f"{int(x)}") if whole else (lambda x: f"{float(x):.3f}")) for v in values]
    return [_text(v, _value_text) for v in values]


def _text(v: Cell, fmt: Callable[[Cell], str]) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return ""
    return fmt(v)


def _value_text(v: object) -> str:
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, (int, np.integer)) for x in v):
            return rank_ranges(v)
        return ", ".join(map(str, v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.3f}"
    return str(v)


def _findings_table(title: str, findings: list[Finding]) -> str:
    """One row per finding, with the ranks it holds on (a finding on ranks 0-7 is one row)."""
    if not findings:
        return f"<h3>{html.escape(title)}</h3><p>none</p>"
    rows = "".join(
        f"<tr><td>{html.escape(f.severity)}</td><td>{html.escape(f.code)}</td><td>{html.escape(f.where)}</td>"
        f"<td>{html.escape(f.message + f.origin_text())}</td></tr>"
        for f in findings[:300]
    )
    head = "<tr><th>severity</th><th>code</th><th>ranks</th><th>finding</th></tr>"
    return f"<h3>{html.escape(title)} ({len(findings)})</h3><table>{head}{rows}</table>"


# ---- plotly.js and the figures, packed ---------------------------------------------------------


def _plot(fig: go.Figure, plots: list[str]) -> str:
    """A figure's place in the page; its data joins ``plots``, which the loader draws there."""
    plots.append(_lightened(fig).to_json())
    height = fig.layout.height or 450
    return f'<div id="plot{len(plots) - 1}" class="plotly-graph-div" style="height:{height}px;width:100%"></div>'


def _lightened(fig: go.Figure) -> go.Figure:
    """What the page needs of a figure: coordinates in float32 (7 digits, plenty for a plot, and
    half the bytes) and no customdata that the hover text does not show (the dashboard's clicks
    read the rest)."""
    for trace in fig.data:
        for attr in ("x", "y", "base"):
            values = getattr(trace, attr, None)
            if isinstance(values, np.ndarray) and values.dtype == np.float64:
                trace[attr] = values.astype(np.float32)
        custom, template = getattr(trace, "customdata", None), getattr(trace, "hovertemplate", None)
        if custom is None or not isinstance(template, (str, type(None))):
            continue
        shown = [int(i) for i in re.findall(r"customdata\[(\d+)\]", template or "")]
        if re.search(r"customdata(?!\[)", template or ""):
            continue  # the whole of it is shown
        if not shown:
            trace.customdata = None
        elif np.ndim(custom) == 2:
            trace.customdata = np.asarray(custom)[:, : max(shown) + 1]
    return fig


_RFC1924 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_TO_PAGE = bytes.maketrans(_RFC1924, B85_ALPHABET)
LZMA_FILTERS = [{"id": lzma.FILTER_LZMA1, "preset": 6, "pb": 0}]
"""LZMA1 (the .lzma format the page's decoder reads); pb=0 as for text (0.3% smaller)."""


def _packed(element_id: str, data: bytes) -> str:
    """``data`` LZMA-compressed and base85-encoded in an inert <script> element that the page's
    loader unpacks; ``data-bytes`` is the unpacked size."""
    text = base64.b85encode(lzma.compress(data, format=lzma.FORMAT_ALONE, filters=LZMA_FILTERS), pad=False)
    return (f'<script type="application/x-sptrace-lzma" id="{element_id}" data-bytes="{len(data)}">'
            f"{text.translate(_TO_PAGE).decode('ascii')}</script>")  # fmt: skip


@functools.cache
def _plotly() -> tuple[str, str]:
    """(plotly.js's licence banner, plotly.js packed). Compressing takes about 3 s, so the packed
    element is kept in sptrace's cache folder, one file per plotly version, written atomically;
    an unreadable or unwritable cache only costs the 3 s."""
    import plotly
    import plotly.offline

    from sptrace.cachedir import default_cache_dir
    from sptrace.fileio import write_atomic

    source = plotly.offline.get_plotlyjs()
    found = re.match(r"\s*/\*.*?\*/", source, flags=re.S)
    banner = found.group(0).strip() if found else "/* plotly.js */"
    digest = hashlib.sha256(repr(LZMA_FILTERS).encode() + bytes(_TO_PAGE)).hexdigest()[:12]
    kept = default_cache_dir() / f"report-plotly-{plotly.__version__}-{len(source)}-{digest}.html"
    try:
        return banner, kept.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        pass
    packed = _packed("sptrace-plotly", source.encode())
    with contextlib.suppress(OSError):
        write_atomic(kept, packed.encode("ascii"))
    return banner, packed
