"""A self-contained HTML report over one or several runs: plotly.js inlined once, so the file
works offline (a CI artifact). It renders sptrace.analysis's RunAnalysis, as the CLI and the
dashboard do; figures come from sptrace.report.figures, shared with the dashboard."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

import pandas as pd

from sptrace import __version__
from sptrace.analysis import RunAnalysis, try_analyse
from sptrace.checks.findings import Finding, Verdict
from sptrace.costmodel import PRESETS
from sptrace.shape import ModelShape
from sptrace.units import human_bytes


def render_html(paths: list[Path], **options: Any) -> tuple[str, int]:
    """(the page, how many runs could be analysed). ``options``: analyse_run's (the model
    flags, load options) for every run."""
    import plotly.offline

    from sptrace.report import figures

    sections, index = [], []
    usable = 0
    for i, path in enumerate(paths):
        a = try_analyse(path, **options)
        if not isinstance(a, RunAnalysis):
            sections.append(
                f'<section id="run{i}"><h2>{html.escape(str(path))}</h2>'
                f'<p class="error">{html.escape(str(a))}</p></section>'
            )
            index.append(f'<li><a href="#run{i}">{html.escape(str(path))}</a>: unusable</li>')
            continue
        usable += 1
        run, model = a.run, a.model
        verdicts = (("collectives", a.collectives_verdict, a.comm_unavailable),
                    ("sharding", a.sharding.verdict if a.sharding else None, a.sharding_unavailable))  # fmt: skip
        badges = "; ".join(f"{check} {badge(check, verdict, why)}" for check, verdict, why in verdicts)
        index.append(f'<li><a href="#run{i}">{html.escape(str(path))}</a>: {badges}</li>')
        parts = [f'<section id="run{i}"><h2>{html.escape(str(path))}</h2>']
        desc = f"{len(run)} of {run.world_size} ranks, backend {run.backend or 'unknown'}; "
        desc += f"{model.label} {model.describe()}"
        parts.append(f"<p>{html.escape(desc)}</p>")
        for label, verdict, why in verdicts:
            line = verdict.line() if verdict is not None else f"not checked: {why}"
            if label == "collectives" and a.comm is None and verdict is not None:
                line += f" (ranks compared with each other; the cost model was skipped: {why})"
            parts.append(
                f'<p class="verdict">{badge(label, verdict, why)} {html.escape(label)}: {html.escape(line)}</p>'
            )
        t = a.time_summary()
        if t["step_ms"] is not None:
            exposed = "n/a (no GPU streams)" if t["exposed_ms"] is None else f"{t['exposed_ms']:.1f} ms"
            share = "" if t["comm_share"] is None else f" ({100 * t['comm_share']:.0f}% of the step)"
            parts.append(html_p(
                f"step {t['step_ms']:.1f} ms (slowest rank, measured by {t['step_source']}); communication "
                f"{t['comm_ms'] or 0:.1f} ms of transfer time per rank{share}; exposed {exposed}"
            ))  # fmt: skip
        frame = a.collectives
        parts.append(_figure(figures.timeline(a)))
        parts.append(_figure(figures.wire_by_kind(frame, a.estimate)))
        parts.append(_figure(figures.wire_by_layer(frame, a.estimate)))
        if a.p2p is not None and not a.p2p.pairs.empty:
            parts.append(_figure(figures.p2p_matrix(a)))
            parts.append(_figure(figures.p2p_steps(a)))
        if a.comm is not None:
            parts.append(_findings_table("collective findings", a.comm.findings))
            parts.append(_table(a.comm.ranks, "per rank: collectives and wire bytes against the model"))
        elif a.crossrank is not None:
            parts.append(_findings_table("cross-rank findings", a.crossrank.findings))
            parts.append(_table(a.crossrank.ranks, "per rank: collectives and wire bytes"))
        if a.sharding is not None:
            parts.append(_figure(figures.retained_by_layer(a.sharding.saved, a.expected_activation_bytes)))
            parts.append(_figure(figures.memory_over_step(a)))
            parts.append(_findings_table("sharding findings", a.sharding.findings))
            parts += [html_p(f"note: {n}") for n in a.sharding.notes]
        if a.matching is not None and not a.matching.matched.empty:
            m = a.matching.matched.drop(columns=["ranks"]).head(200)
            parts.append(_table(m, "matched collectives (first 200): skew, straggler, bandwidth"))
        for w in a.warnings:
            parts.append(f'<p class="warning">{html.escape(w)}</p>')
        parts.append("</section>")
        sections.append("\n".join(parts))
    article = {k: v for k, v in PRESETS["seed-3.6b"].items() if k != "attention_only"}
    base = ModelShape.from_mapping({**article, "scheme": "megatron", "recompute": "none"}, "preset seed-3.6b")
    sweep = _figure(figures.model_sweep(base, [8192 * 2**i for i in range(6)]))
    page = _PAGE.format(
        font=figures.FONT,
        version=__version__, created=time.strftime("%Y-%m-%d %H:%M"), plotly=plotly.offline.get_plotlyjs(),
        index="\n".join(index), sections="\n".join(sections), sweep=sweep,
    )  # fmt: skip
    return page, usable


def _figure(fig: Any) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def badge(check: str, verdict: Verdict | None, why: str | None = None) -> str:
    """The dashboard's verdict badge: same labels and colours, the reasons on hover."""
    from sptrace.report.figures import VERDICT_COLORS

    if verdict is None:
        status, label, tip = "unavailable", "NOT CHECKED", f"{check} not checked: {why or 'no data'}"
    else:
        status, label = verdict.status, verdict.label
        tip = "\n".join([verdict.summary, *verdict.reasons])
    return (f'<span class="badge verdict-{status}" style="background:{VERDICT_COLORS[status]}" '
            f'title="{html.escape(tip)}">{html.escape(label)}</span>')  # fmt: skip


def html_p(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def _table(frame: pd.DataFrame, title: str) -> str:
    shown = frame.copy()
    for col in shown.columns:
        if col.endswith("bytes"):
            shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else human_bytes(float(v)))
    return f"<h3>{html.escape(title)}</h3>" + shown.to_html(index=False, float_format=lambda v: f"{v:.3g}", border=0)


def _findings_table(title: str, findings: list[Finding]) -> str:
    """One row per finding, with the ranks it holds on (a finding on ranks 0-7 is one row)."""
    if not findings:
        return f"<h3>{html.escape(title)}</h3><p>none</p>"
    rows = "".join(
        f"<tr><td>{html.escape(f.severity)}</td><td>{html.escape(f.code)}</td><td>{html.escape(f.where)}</td>"
        f"<td>{html.escape(f.message)}</td></tr>"
        for f in findings[:300]
    )
    head = "<tr><th>severity</th><th>code</th><th>ranks</th><th>finding</th></tr>"
    return f"<h3>{html.escape(title)} ({len(findings)})</h3><table>{head}{rows}</table>"


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>sptrace report</title>
<script type="text/javascript">{plotly}</script>
<style>body{{font-family:{font};margin:2em;color:#212529}} h1,h2,h3{{font-weight:700}}
table{{border-collapse:collapse;font-size:13px}}
td,th{{padding:3px 10px;border-bottom:1px solid #dee2e6;text-align:left}}
th{{background:#f8f9fa}} .error{{color:#e03131}} .warning{{color:#e8590c}} .verdict{{font-weight:600}}
a{{color:#1971c2;text-decoration:none}} a:hover{{text-decoration:underline}}
.badge{{display:inline-block;color:#fff;font-size:11px;font-weight:700;padding:2px 8px;border-radius:4px;
letter-spacing:.03em;vertical-align:middle}}</style></head>
<body><h1>sptrace report</h1><p>sptrace {version}, {created}</p>
<ul>{index}</ul>
{sections}
<section><h2>the cost model across sequence lengths (the first article's 3.6B model, P=8, bf16)</h2>{sweep}</section>
</body></html>
"""
