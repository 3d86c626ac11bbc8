"""Compare: the runs chosen in the header side by side (step time and its communication, wire
bytes against the model, retained bytes per layer against Korthikanti's figure, verdicts), the
cost model across sequence lengths at the first chosen run's declared model, and any sweep with
its fitted regression."""

from __future__ import annotations

import dash_mantine_components as dmc
from dash.development.base_component import Component
from sptrace.dashboards.pages.common import View, card, error_box, graph, grid, note_box, page_title, verdict_badge
from sptrace.dashboards.store import RunStore

from sptrace.analysis import RunAnalysis
from sptrace.report.compare import compare_runs, model_sweep, sweep_fit
from sptrace.sweep import UNDERDETERMINED


def sweep_section(store: RunStore, index: int) -> list[Component]:
    root = store.sweeps[index]
    sweep = store.sweep(index)
    if sweep is None:
        return [error_box(f"{root}: no comparison.csv (run `sptrace sweep --out {root}` first)", title="not a sweep")]
    table, fit = sweep.table, sweep.fit
    parts: list[Component] = [dmc.Title(f"sweep {root.name}", order=3, mt="lg")]
    if fit:
        c = fit["coefficients"]
        r2 = "n/a" if fit.get("r2") is None else f"{fit['r2']:.4f}"
        terms = " + ".join(f"{v:.4g}·{k}" for k, v in c.items() if k != "intercept")
        if fit.get("underdetermined"):
            parts.append(note_box(f"underdetermined: {UNDERDETERMINED} ({fit['runs']} runs)", title="the fit",
                                  class_name="underdetermined"))  # fmt: skip
        art = fit["article"]
        parts += [
            dmc.Text(f"fit over {fit['runs']} runs: time_ms = {c['intercept']:.4g} + {terms} (R² {r2}, mean abs error "
                     f"{fit['mae_ms']:.1f} ms)", size="sm", className="fit"),
            dmc.Text(f"the article (36 runs, 8×H100): time_ms = {art['intercept']} + {art['peak_GiB']}·peak_GiB + "
                     f"{art['comm_GiB']}·comm_GiB + {art['S_K']}·S_K + {art['S_K^2']}·S_K² (R² {art['r2']})",
                     size="sm", c="dimmed"),
            graph(f"sweep-fit-{root.name}", sweep_fit(sweep)),
        ]  # fmt: skip
    parts.append(grid(table, f"sweep-grid-{root.name}", f"sweep runs ({root.name})"))
    return parts


def render(store: RunStore, view: View) -> list[Component]:
    head = page_title("Compare", "The runs chosen in the header, side by side; the cost model across sequence "
                      "lengths.")  # fmt: skip
    chosen = [(i, store.get(i)) for i in view.chosen(len(store))]
    usable = [(i, a) for i, a in chosen if isinstance(a, RunAnalysis)]
    parts: list[Component] = [head]
    parts += [error_box(f"{store.name(i)}: {a}") for i, a in chosen if not isinstance(a, RunAnalysis)]
    if usable:
        strip = [
            card(dmc.Stack([
                dmc.Text(store.name(i), fw=700, className="run-name"),
                dmc.Text(a.model.label, size="xs", c="dimmed"),
                dmc.Group([verdict_badge("collectives", a.collectives_verdict, a.comm_unavailable, "sm"),
                           verdict_badge("sharding", a.sharding.verdict if a.sharding else None,
                                         a.sharding_unavailable, "sm")], gap=6),
            ], gap=4), padding="sm")
            for i, a in usable
        ]  # fmt: skip
        parts.append(dmc.SimpleGrid(strip, cols={"base": 2, "md": 4, "xl": 6}, spacing="sm", mb="md",
                                    id="compare-verdicts"))  # fmt: skip
        parts.append(graph("compare-runs", compare_runs([a for _, a in usable])))
    elif not chosen:
        parts.append(note_box("choose runs in the header to compare them", color="gray"))
    # the cost model at the first chosen run that declares its whole model: that run's own sweep,
    # the one its HTML report draws (a sweep of sizes no run declared would describe no run here)
    swept = next(((store.name(i), a, sweep) for i, a in usable if (sweep := a.model_sweep) is not None), None)
    parts.append(dmc.Title("the cost model across sequence lengths", order=3, mt="lg"))
    if swept is None:
        parts.append(note_box("no chosen run declares every size the cost model needs: declare them (run.json, "
                              "--config or flags) to sweep that run's model", color="gray"))  # fmt: skip
    else:
        name, first, sweep = swept
        parts.append(dmc.Text(f"wire bytes per rank and step for each scheme, at {name}'s model: {sweep.describe()}",
                              size="sm", c="dimmed"))  # fmt: skip
        parts.append(graph("compare-sweep", model_sweep(first)))
    for index in range(len(store.sweeps)):
        parts += sweep_section(store, index)
    return parts
