"""Compare: the runs chosen in the header side by side (step time and its communication, wire
bytes against the model, retained bytes per layer against Korthikanti's figure, verdicts), the
cost model across sequence lengths, and any sweep with its fitted regression."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dash_mantine_components as dmc
from sptrace.dashboards.pages.common import View, card, error_box, graph, grid, note_box, page_title, verdict_badge
from sptrace.dashboards.store import RunStore
from sptrace.reference_models.config import StepConfig

from sptrace.analysis import RunAnalysis
from sptrace.costmodel.comm import NEEDS
from sptrace.report import figures


def sweep_section(root: Path) -> list[Any]:
    from sptrace.sweep import UNDERDETERMINED, load_sweep

    loaded = load_sweep(root)
    if loaded is None:
        return [error_box(f"{root}: no comparison.csv (run `sptrace sweep --out {root}` first)", title="not a sweep")]
    table, fit = loaded
    parts: list[Any] = [dmc.Title(f"sweep {root.name}", order=3, mt="lg")]
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
            graph(f"sweep-fit-{root.name}", figures.sweep_fit(table, fit)),
        ]  # fmt: skip
    parts.append(grid(table, f"sweep-grid-{root.name}", f"sweep runs ({root.name})"))
    return parts


def render(store: RunStore, view: View) -> Any:
    head = page_title("Compare", "The runs chosen in the header, side by side; the cost model across sequence "
                      "lengths.")  # fmt: skip
    chosen = [(i, store.get(i)) for i in view.chosen(len(store))]
    usable = [(i, a) for i, a in chosen if isinstance(a, RunAnalysis)]
    parts: list[Any] = [head]
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
        parts.append(graph("compare-runs", figures.compare_runs([a for _, a in usable])))
    elif not chosen:
        parts.append(note_box("choose runs in the header to compare them", color="gray"))
    # the cost model: the first chosen run whose model is fully declared, else the reference defaults
    declared = [(store.name(i), a.model) for i, a in usable if not a.model.missing(NEEDS)]
    base = declared[0][1] if declared else StepConfig().shape()
    seqs = sorted({base.seq * 2**k // 4 for k in range(8) if base.seq * 2**k // 4 >= base.sp_size})
    seqs = [s for s in seqs if s % base.sp_size == 0]
    source = f"at {declared[0][0]}'s settings" if declared else "at the reference models' defaults"
    parts.append(dmc.Title("the cost model across sequence lengths", order=3, mt="lg"))
    parts.append(dmc.Text(f"wire bytes per rank and step for each scheme, {source}", size="sm", c="dimmed"))
    parts.append(graph("compare-sweep", figures.model_sweep(base, seqs)))
    for root in store.sweeps:
        parts += sweep_section(root)
    return parts
