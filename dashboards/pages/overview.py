"""Overview: a card per run answering "where does my step's time go, and is my memory
sharded?": step time, communication share (transfer time), exposed communication, wire bytes
against the model and retained bytes per layer against Korthikanti's figure, each with its
verdict, and the run's findings merged across ranks, each linking to the page that shows it."""

from __future__ import annotations

import dash_mantine_components as dmc
from dash import dcc, html
from dash.development.base_component import Component
from sptrace.dashboards.pages.common import View, card, error_box, findings_list, href, page_title, verdict_badge
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunFacts
from sptrace.report.theme import COLORS
from sptrace.vocab.errors import SptraceError
from sptrace.vocab.units import human_bytes, human_ms


def _stat(
    label: str, value: str, detail: str | None = None, badge: Component | None = None, stat_id: str | None = None
) -> Component:
    row = [dmc.Text(value, fw=700, size="lg", className="stat-value")]
    if badge is not None:
        row.append(badge)
    body = [dmc.Text(label, size="xs", c="dimmed", tt="uppercase", fw=600), dmc.Group(row, gap="xs")]
    if detail:
        body.append(dmc.Text(detail, size="xs", c="dimmed"))
    kwargs = {"id": stat_id} if stat_id else {}
    return dmc.Stack(body, gap=2, className="stat", **kwargs)


def _swatch(color: str) -> Component:
    return html.Span(style={"display": "inline-block", "width": 10, "height": 10, "borderRadius": 2,
                            "background": color})  # fmt: skip


def time_bar(facts: RunFacts) -> Component:
    """The step split into exposed communication, overlapped communication and the rest."""
    step, comm, exposed = facts.step_ms, facts.comm_ms, facts.exposed_ms
    if not step or comm is None:
        return dmc.Text("no step time in this trace", size="xs", c="dimmed")
    sections = []
    if exposed is not None:
        sections.append(("exposed communication", exposed, COLORS["red"]))
        sections.append(("communication overlapped by compute", max(comm - exposed, 0.0), COLORS["orange"]))
    else:
        sections.append(("communication (transfer)", comm, COLORS["orange"]))
    rest = max(step - sum(v for _, v, _ in sections), 0.0)
    sections.append(("everything else (compute, idle)", rest, "#ced4da"))
    bars = [dmc.ProgressSection(value=100 * v / step, color=color) for _, v, color in sections if v > 0]
    legend = dmc.Group(
        [dmc.Group([_swatch(c), dmc.Text(f"{n} {v:.1f} ms", size="xs")], gap=4)
         for n, v, c in sections],
        gap="sm",
    )  # fmt: skip
    return dmc.Stack([dmc.ProgressRoot(bars, size="xl", className="time-bar"), legend], gap=4)


def run_card(store: RunStore, i: int, selected: bool) -> Component:
    a = store.get(i)
    name = dmc.Text(store.name(i), fw=700, size="lg", className="run-name")
    if isinstance(a, SptraceError):
        return card([name, error_box(str(a))], className="run-card", id=f"run-card-{i}")
    run, model = a.run, a.model
    facts = a.facts  # the card's numbers (None where the run cannot tell)
    desc = f"{len(run)} of {run.world_size} ranks · {run.backend or 'unknown backend'}"
    shape_bits = [f"{k} {v}" for k, v in (("S", model.seq), ("P", model.sp_size), ("L", model.layers)) if v]
    step = facts.step_ms
    step_detail = "slowest rank" + (f"; {facts.step_source}" if facts.step_source else "")
    share = facts.comm_share
    exposed = facts.exposed_ms
    wire, model_wire = facts.wire_bytes, facts.model_wire_bytes
    kept, korth = facts.retained_per_layer, a.expected_activation_bytes
    stats = dmc.SimpleGrid([
        _stat("step time", "n/a" if step is None else f"{step:.1f} ms", step_detail, stat_id=f"step-{i}"),
        _stat("communication", "n/a" if share is None else f"{100 * share:.1f} %",
              None if facts.comm_ms is None else f"{facts.comm_ms:.1f} ms of transfer per rank",
              stat_id=f"comm-{i}"),
        _stat("exposed communication", "n/a" if exposed is None else human_ms(exposed),
              "no GPU streams: nothing to overlap with" if exposed is None else "not overlapped by compute kernels",
              stat_id=f"exposed-{i}"),
        _stat("wire bytes per rank", human_bytes(wire),
              f"model {human_bytes(model_wire)}" if model_wire is not None else "no model: shape not declared",
              verdict_badge("collectives", a.collectives_verdict, a.comm_unavailable),
              stat_id=f"wire-{i}"),
        _stat("retained per layer", "n/a" if kept is None else human_bytes(kept),
              f"Korthikanti et al. {human_bytes(korth)}" if korth else None,
              verdict_badge("sharding", a.sharding.verdict if a.sharding else None, a.sharding_unavailable),
              stat_id=f"retained-{i}"),
    ], cols=2, spacing="md", verticalSpacing="sm")  # fmt: skip
    links = dmc.Group(
        [dcc.Link(title, href=href(page, i), className="sptrace-link")
         for page, title in (("timeline", "Timeline"), ("collectives", "Collectives"), ("memory", "Memory"))],
        gap="md",
    )  # fmt: skip
    warn = [dmc.Text(w, size="xs", c="orange.8") for w in a.warnings[:3]]
    return card(
        [
            dmc.Group([name, dmc.Badge(model.label, variant="light", color="gray")], justify="space-between",
                      align="flex-start", wrap="nowrap"),
            dmc.Text(" · ".join([desc, *shape_bits]), size="sm", c="dimmed", mb="sm"),
            time_bar(facts),
            dmc.Divider(my="sm"),
            stats,
            *[dmc.Group([dmc.Text(r.title, size="sm"), verdict_badge(r.name, r.verdict, r.unavailable, size="sm")],
                        gap="xs", mt="xs", id=f"check-{r.name}-{i}")
              for name, r in a.reports.items() if name not in ("collectives", "sharding")],  # registered checks
            dmc.Divider(my="sm", label="findings", labelPosition="left"),
            findings_list(a.findings(), i, limit=6),
            *warn,
            dmc.Divider(my="sm"),
            links,
        ],
        className="run-card" + (" selected" if selected else ""), id=f"run-card-{i}",
        style={"borderColor": "var(--mantine-color-blue-4)"} if selected else None,
    )  # fmt: skip


def render(store: RunStore, view: View) -> Component:
    n = len(store)
    cards = [run_card(store, i, selected=(i == view.run and n > 1)) for i in range(n)]
    return dmc.Stack([
        page_title("Overview", f"{n} run{'s' if n != 1 else ''}: where each step's time goes, and whether "
                   "activations stay sharded. Hover a badge for its reasons."),
        dmc.SimpleGrid(cards, cols={"base": 1, "md": 2, "xl": 3}, spacing="lg", id="overview-cards"),
    ], gap=0)  # fmt: skip
