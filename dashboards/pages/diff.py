"""Diff: what a change did, from one served run (the baseline) to another, the pair chosen in the
header (``/diff?base=0&new=1``): the verdict and the job's changes first, then communication by
layer, phase and kind, retained tensors by module, and time; rows that got worse in red, better in
green. The comparison ``sptrace diff`` prints (sptrace.diff.diff_runs), drawn here."""

from __future__ import annotations

import dash_mantine_components as dmc
from dash import Dash, Input, NoUpdate, Output, State, html, no_update
from dash.development.base_component import Component
from sptrace.dashboards.pages.common import View, error_box, note_box, page_title
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunAnalysis
from sptrace.diff import RunDiff, diff_runs
from sptrace.report.diff import verdict_line
from sptrace.timechange import Spread
from sptrace.vocab.units import human_bytes


def pair(view: View, n: int) -> tuple[int, int]:
    """(base, new) from the URL: by default the first two runs."""

    def index(key: str, default: int) -> int:
        try:
            value = int(view.params.get(key, default))
        except ValueError:
            return default
        return value if 0 <= value < n else default

    return index("base", 0), index("new", 1 if n > 1 else 0)


def render(store: RunStore, view: View) -> list[Component]:
    head = page_title("Diff", "What a change did: the baseline against the new run, by layer, phase, kind and "
                      "module (the comparison `sptrace diff BASE NEW` prints).")  # fmt: skip
    n = len(store)
    if n < 2:
        return [head, note_box("serve two runs to compare them: sptrace dash BASE NEW", color="gray")]
    b, new = pair(view, n)  # (chosen in the header: base and new)
    parts: list[Component] = [head, dmc.Text(f"{store.name(b)} -> {store.name(new)}", fw=600, mb="sm", id="diff-pair")]
    analyses = [store.get(b), store.get(new)]
    bad = [(i, a) for i, a in zip((b, new), analyses) if not isinstance(a, RunAnalysis)]
    if bad:
        return parts + [error_box(f"{store.name(i)}: {a}", title="cannot compare") for i, a in bad]
    d = store.cached(b, f"diff-with-{new}", lambda: diff_runs(*analyses))  # type: ignore[arg-type]
    color = "red" if d.regressions else "green"
    lines = [dmc.Text(r, size="sm") for r in d.regressions]
    parts.append(dmc.Alert(lines or None, title=verdict_line(d) if not d.regressions else "REGRESSION", color=color,
                           variant="light", id="diff-verdict", mb="md"))  # fmt: skip
    if d.shape_changes:
        text = ", ".join(f"{f} {x} -> {y}" for f, x, y in d.shape_changes)
        how = " (bytes and time compared per token)" if d.per_token else ""
        parts.append(note_box(f"the job changed: {text}{how}", title="shape", class_name="diff-shape"))
    if d.config_changes:
        parts.append(note_box(", ".join(f"{k} {x} -> {y}" for k, x, y in d.config_changes), title="run.json config",
                              color="gray"))  # fmt: skip
    parts += [*_communication(d), *_retained(d), *_time(d)]
    parts += [note_box(text, color="gray") for text in d.notes]
    return parts


def _table(table_id: str, header: list[str], rows: list[tuple[str, list[str]]]) -> Component:
    """A plain table; each row's class (diff-worse, diff-better, diff-same) colours it."""
    head = html.Thead(html.Tr([html.Th(h) for h in header]))
    body = html.Tbody([html.Tr([html.Td(c) for c in cells], className=cls) for cls, cells in rows])
    return dmc.Table([head, body], id=table_id, className="diff-table", striped=False, highlightOnHover=True,
                     withTableBorder=True, mb="lg")  # fmt: skip


def _communication(d: RunDiff) -> list[Component]:
    changed = d.comm_changed
    out: list[Component] = [dmc.Title("communication, per rank and step", order=3, mt="md")]
    wb, wn = d.wire
    if wb is not None and wn is not None:
        out.append(dmc.Text(f"wire bytes: {human_bytes(wb)} -> {human_bytes(wn)}", size="sm", mb="xs"))
    if not changed:
        return [*out, dmc.Text("no collective added, removed or changed", size="sm", c="dimmed", mb="md")]
    rows = []
    for c in changed:
        bs, ns = c.base, c.new
        cls = "diff-worse" if c.wire_delta > 0 or "added" in c.changed else "diff-better" if c.wire_delta < 0 else ""
        rows.append((cls, [
            c.phase, "-" if c.layer is None else str(c.layer), c.kind, ", ".join(c.changed),
            f"{bs.count if bs else 0:g} -> {ns.count if ns else 0:g}",
            " -> ".join(human_bytes(s.per_op(s.wire_bytes)) if s else "-" for s in (bs, ns)),
            ("+" if c.wire_delta > 0 else "") + human_bytes(c.wire_delta),
        ]))  # fmt: skip
    return [*out, _table("diff-comm", ["phase", "layer", "kind", "change", "count", "wire each", "wire delta"], rows)]


def _retained(d: RunDiff) -> list[Component]:
    kept = d.kept_changed
    out: list[Component] = [dmc.Title("retained for backward (the largest rank and boundary)", order=3, mt="md")]
    if not kept:
        return [*out, dmc.Text("no module keeps more, less or other tensors", size="sm", c="dimmed", mb="md")]
    rows = []
    for k in kept:
        b, n = k.base, k.new
        cls = "diff-worse" if k.became_full or k.bytes_delta > 0 else "diff-better" if k.bytes_delta < 0 else ""
        shapes = ", ".join(n.full_shapes) if n is not None and k.became_full else ""
        rows.append((cls, [
            k.module, f"{b.tensors if b else 0} -> {n.tensors if n else 0}",
            f"{human_bytes(b.bytes) if b else '-'} -> {human_bytes(n.bytes) if n else '-'}",
            f"{b.full if b else 0} -> {n.full if n else 0}", shapes,
        ]))  # fmt: skip
    return [*out, _table("diff-retained", ["module", "tensors", "kept", "full-size", "new full-size shapes"], rows)]


def _time(d: RunDiff) -> list[Component]:
    k = 1e3 if d.per_token else 1.0  # per token: microseconds

    def ms(s: Spread | None) -> str:
        return "?" if s is None else f"{s.median * k:.2f} [{s.low * k:.2f}-{s.high * k:.2f}]"

    changes = [*d.time, *d.module_time_moved]
    rows = []
    for t in changes:
        rel = t.relative
        cls = "" if not t.outside_noise else "diff-worse" if (rel or 0) > 0 else "diff-better"
        rows.append((cls, [t.what, ms(t.base), ms(t.new), "" if rel is None else f"{rel:+.1%}",
                           "yes" if t.outside_noise else "no"]))  # fmt: skip
    unit = "us a token" if d.per_token else "ms"
    title = dmc.Title(f"time ({unit}: the median over ranks [least-most])", order=3, mt="md")
    return [title, _table("diff-time", ["what", "baseline", "new", "change", "beyond the noise"], rows)] if rows else []


def register(app: Dash, store: RunStore) -> None:
    @app.callback(
        Output("url", "search", allow_duplicate=True),
        Input("diff-base", "value"),
        Input("diff-new", "value"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def _choose(base: str | None, new: str | None, search: str | None) -> str | NoUpdate:
        if base is None or new is None:
            return no_update
        wanted = f"?base={int(base)}&new={int(new)}"
        return no_update if (search or "") == wanted else wanted
