"""A self-contained HTML report over one or several runs: plotly.js inlined once, so the file
works offline (a CI artifact). Figures come from dashboards.figures, shared with the app."""

from __future__ import annotations

import html
import time
from pathlib import Path

import pandas as pd

from sptrace import __version__
from sptrace.config import StepConfig
from sptrace.errors import SptraceError
from sptrace.pipeline import analyse_run
from sptrace.units import human_bytes


def render_html(paths: list[Path]) -> str:
    import plotly.offline

    from dashboards import figures

    sections, index = [], []
    for i, path in enumerate(paths):
        try:
            a = analyse_run(path)
        except SptraceError as exc:
            sections.append(
                f'<section id="run{i}"><h2>{html.escape(str(path))}</h2>'
                f'<p class="error">{html.escape(str(exc))}</p></section>'
            )
            index.append(f'<li><a href="#run{i}">{html.escape(str(path))}</a>: unusable</li>')
            continue
        run, cfg = a["run"], a["config"]
        verdicts = []
        if "comm" in a:
            verdicts.append(
                "collectives MATCH" if a["comm"].ok else f"collectives MISMATCH ({len(a['comm'].findings)} findings)"
            )
        if "sharding" in a:
            s = a["sharding"]
            verdicts.append("sharding PASS" if s.ok else f"sharding FAIL ({len(s.findings)} full-size saves)")
        index.append(
            f'<li><a href="#run{i}">{html.escape(str(path))}</a>: '
            f"{html.escape('; '.join(verdicts) or 'no run.json')}</li>"
        )
        parts = [f'<section id="run{i}"><h2>{html.escape(str(path))}</h2>']
        desc = f"{len(run)} of {run.world_size} ranks, backend {run.backend or 'unknown'}"
        if cfg is not None:
            desc += (f"; {cfg.scheme}{' ZeRO-3' if cfg.zero3 else ''} P={cfg.sp_size} L={cfg.layers} B={cfg.batch} "
                     f"S={cfg.seq} H={cfg.hidden} a={cfg.heads} g={cfg.kv_heads} F={cfg.ffn} {cfg.dtype}")  # fmt: skip
        parts.append(f'<p>{html.escape(desc)}</p><p class="verdict">{html.escape("; ".join(verdicts))}</p>')
        frame = a["collectives"]
        parts.append(
            figures.collective_timeline(frame, a["matching"].offsets_us).to_html(
                full_html=False, include_plotlyjs=False
            )
        )
        parts.append(figures.wire_by_kind(frame, cfg).to_html(full_html=False, include_plotlyjs=False))
        if "comm" in a:
            parts.append(_findings_table("collective findings", a["comm"].findings))
            parts.append(_table(a["comm"].ranks, "per rank: collectives and wire bytes against the model"))
        if "sharding" in a:
            parts.append(figures.saved_by_layer(a["sharding"].saved).to_html(full_html=False, include_plotlyjs=False))
            parts.append(_findings_table("sharding findings", a["sharding"].findings))
        if not a["matching"].matched.empty:
            m = a["matching"].matched.drop(columns=["ranks"]).head(200)
            parts.append(_table(m, "matched collectives (first 200): skew, straggler, bandwidth"))
        for w in a["warnings"]:
            parts.append(f'<p class="warning">{html.escape(w)}</p>')
        parts.append("</section>")
        sections.append("\n".join(parts))
    cfg0 = StepConfig(layers=8, batch=1, seq=8192, hidden=6144, heads=48, kv_heads=48, ffn=24576, dtype="bfloat16")
    sweep = figures.model_sweep(cfg0, [8192 * 2**i for i in range(6)]).to_html(full_html=False, include_plotlyjs=False)
    return _PAGE.format(
        version=__version__, created=time.strftime("%Y-%m-%d %H:%M"), plotly=plotly.offline.get_plotlyjs(),
        index="\n".join(index), sections="\n".join(sections), sweep=sweep,
    )  # fmt: skip


def _table(frame: pd.DataFrame, title: str) -> str:
    shown = frame.copy()
    for col in shown.columns:
        if col.endswith("bytes"):
            shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else human_bytes(float(v)))
    return f"<h3>{html.escape(title)}</h3>" + shown.to_html(index=False, float_format=lambda v: f"{v:.3g}", border=0)


def _findings_table(title: str, findings: list) -> str:
    if not findings:
        return f"<h3>{html.escape(title)}</h3><p>none</p>"
    rows = "".join(
        f"<tr><td>{html.escape(f.severity)}</td><td>{html.escape(f.code)}</td><td>{html.escape(f.message)}</td></tr>"
        for f in findings[:300]
    )
    head = "<tr><th>severity</th><th>code</th><th>finding</th></tr>"
    return f"<h3>{html.escape(title)} ({len(findings)})</h3><table>{head}{rows}</table>"


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>sptrace report</title>
<script type="text/javascript">{plotly}</script>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:12px}}
td,th{{padding:2px 8px;border-bottom:1px solid #ddd}} .error{{color:#b00}} .warning{{color:#a60}}
.verdict{{font-weight:bold}}</style></head>
<body><h1>sptrace report</h1><p>sptrace {version}, {created}</p>
<ul>{index}</ul>
{sections}
<section><h2>the cost model across sequence lengths (the first article's 3.6B model, P=8, bf16)</h2>{sweep}</section>
</body></html>
"""
