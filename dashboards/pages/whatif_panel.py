"""The Timeline's what-if (sptrace.whatif, as ``sptrace whatif``): the step replayed across ranks with
changed costs (communication, compute, one module of the critical path, balanced ranks, no waiting),
beside the replay with nothing changed, which must reproduce the measured step (its error is always
said). A folded panel under the critical path; the replay runs when a value changes (a few ms)."""

from __future__ import annotations

import dash_mantine_components as dmc
import plotly.graph_objects as go
from dash import Dash, Input, Output, State, html
from dash.development.base_component import Component
from sptrace.dashboards.pages.common import error_box, graph, note_box
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunAnalysis
from sptrace.report.whatif import whatif_paths
from sptrace.vocab.errors import SptraceError
from sptrace.vocab.units import significant
from sptrace.whatif import Changes, WhatIf, what_if

Factor = float | int | str | None
"""A NumberInput's value: a number, or text while the user types (empty when cleared)."""


def module_options(a: RunAnalysis) -> list[dict[str, str]]:
    """The modules on the measured critical path, longest there first."""
    path = a.critical_path
    if path is None:
        return []
    table = path.module_table()
    modules = [m for m in dict.fromkeys(table["module"]) if m != "(no module)"]
    return [{"label": m, "value": m} for m in modules]


def panel(a: RunAnalysis) -> list[Component]:
    """The folded what-if panel, or nothing when the run has no critical path to replay."""
    if a.critical_path is None:
        return []
    if not a.replay_graphs:
        body: list[Component] = [dmc.Text("This analysis holds no replay graph (analysed without the whatif part, "
                                          "or the trace records no step window): run sptrace whatif.", size="sm",
                                          c="dimmed", id="whatif-unavailable")]  # fmt: skip
    else:
        factor = {"min": 0, "step": 0.1, "decimalScale": 3, "w": 110, "size": "sm", "allowNegative": False}
        controls = dmc.Group([
            dmc.NumberInput(id="whatif-comm", label="comm ×", value=1, **factor),
            dmc.NumberInput(id="whatif-compute", label="compute ×", value=1, **factor),
            dmc.Select(id="whatif-module", label="module on the path", data=module_options(a), value=None,
                       placeholder="none", clearable=True, searchable=True, w=230, size="sm",
                       comboboxProps={"width": "max-content"}),
            dmc.NumberInput(id="whatif-module-scale", label="module ×", value=1, **factor),
            html.Div(dmc.Switch(id="whatif-balance", label="balance ranks", checked=False, size="sm", mb=8),
                     title="every rank's compute per layer and phase at the median rank's (no straggler)"),
            html.Div(dmc.Switch(id="whatif-no-wait", label="no wait", checked=False, size="sm", mb=8),
                     title="no collective waits for its last member (the lower bound)"),
        ], align="flex-end", gap="md")  # fmt: skip
        body = [controls, html.Div(id="whatif-result", style={"marginTop": "12px"}),
                graph("whatif-graph", whatif_paths(a.critical_path, None))]  # fmt: skip
    return [dmc.Accordion(
        dmc.AccordionItem([
            dmc.AccordionControl("What if: the step replayed with changed costs"),
            dmc.AccordionPanel(body),
        ], value="whatif"),
        id="whatif-accordion", variant="contained", mt="lg", chevronPosition="left",
    )]  # fmt: skip


def changes(comm: Factor, compute: Factor, module: str | None, module_scale: Factor, balance: bool | None,
            no_wait: bool | None) -> Changes:  # fmt: skip
    """The panel's values as Changes; a factor that is not a number >= 0 raises SptraceError naming it."""
    modules = ((module, _factor("module", module_scale)),) if module else ()
    return Changes(comm=_factor("comm", comm), compute=_factor("compute", compute), modules=modules,
                   balance=bool(balance), no_wait=bool(no_wait))  # fmt: skip


def _factor(what: str, value: Factor) -> float:
    try:
        factor = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        factor = -1.0
    if not 0 <= factor < float("inf"):
        raise SptraceError(f"{what} ×: a number >= 0, please")
    return factor


def result_lines(result: WhatIf) -> Component:
    """Measured, replayed (its calibration) and predicted, in the words of ``sptrace whatif``."""
    ms = lambda us: f"{significant(us / 1e3)} ms"  # noqa: E731
    steps = f" (the slowest of {len(result.steps)} profiled steps)" if len(result.steps) > 1 else ""
    gain = result.gain
    return dmc.Stack([
        dmc.Text(f"what if: {result.changes.describe()}", size="sm", fw=600, id="whatif-changes"),
        dmc.Text(f"measured step {ms(result.measured_us)}{steps}", size="sm", id="whatif-measured"),
        dmc.Text(f"replayed, no change {ms(result.baseline_us)} ({result.calibration_line()})", size="sm",
                 c="dimmed" if result.calibrated else "orange.8", id="whatif-replayed"),
        dmc.Text(f"predicted {ms(result.predicted_us)} ({gain:+.1%} against the replay)", size="sm", fw=600,
                 c="green.8" if gain < -0.0005 else "red.8" if gain > 0.0005 else "dark", id="whatif-predicted"),
    ], gap=2)  # fmt: skip


def register(app: Dash, store: RunStore) -> None:
    @app.callback(
        Output("whatif-result", "children"),
        Output("whatif-graph", "figure"),
        Input("whatif-comm", "value"),
        Input("whatif-compute", "value"),
        Input("whatif-module", "value"),
        Input("whatif-module-scale", "value"),
        Input("whatif-balance", "checked"),
        Input("whatif-no-wait", "checked"),
        State("header-run", "value"),
    )
    def _whatif(comm: Factor, compute: Factor, module: str | None, module_scale: Factor, balance: bool | None,
                no_wait: bool | None, run: str | None) -> tuple[Component, go.Figure]:  # fmt: skip
        """The replay with the panel's changes, on the run shown (the store's analysis)."""
        a = store.get(run)
        if isinstance(a, SptraceError):
            return error_box(str(a)), whatif_paths(None, None)
        try:
            result = what_if(a, changes(comm, compute, module, module_scale, balance, no_wait))
        except SptraceError as exc:
            return note_box(str(exc), "no what-if", "red", "whatif-error"), whatif_paths(a.critical_path, None)
        return result_lines(result), whatif_paths(a.critical_path, result.path)
