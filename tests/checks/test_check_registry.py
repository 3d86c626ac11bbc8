"""GIVEN a check added only through the registry (sptrace.checks.registry.register): a budget of
bytes each rank may send per step, which gates CI, written here the way a team would write its own
WHEN `sptrace analyze`, `sptrace check` (text, JSON, JUnit) and `sptrace report` run on a committed
2-rank ring-attention run (tests/golden/runs/ring-mha), once with a budget the run keeps and once
with one it breaks
THEN the check's title, findings and verdict appear in every output, its FAIL turns `check`'s exit
code to 1 over the sharding check's PASS, and without the registration nothing of it appears."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sptrace.analysis import analyse_run
from sptrace.checks import registry
from sptrace.checks.findings import Finding, Verdict, merge_ranks
from sptrace.checks.registry import CheckFacts, CheckReport
from sptrace.cli import main
from sptrace.vocab.shape import ModelShape
from sptrace.vocab.units import human_bytes

RUN = Path(__file__).resolve().parents[1] / "golden" / "runs" / "ring-mha"


class WireBudget:
    name = "wire_budget"
    title = "bytes on the wire within the budget"
    needs = frozenset({"collectives"})
    gate = True

    def __init__(self, budget: float) -> None:
        self.budget = budget

    def run(self, facts: CheckFacts, model: ModelShape) -> CheckReport:
        sent = facts.collectives.groupby("rank")["wire_bytes"].sum()
        over = merge_ranks(
            Finding(
                "error",
                self.name,
                "over-budget",
                f"sends {human_bytes(b)}, over {human_bytes(self.budget)}",
                ranks=(int(r),),
            )
            for r, b in sent.items()
            if b > self.budget
        )
        verdict = (Verdict("fail", "FAIL", f"{len(over)} ranks over the budget") if over
                   else Verdict("pass", "PASS", f"every rank within {human_bytes(self.budget)}"))  # fmt: skip
        return CheckReport(self.name, self.title, verdict, tuple(over), notes=("a team's own budget",), gate=self.gate)


@pytest.fixture
def budget():
    def install(b: float) -> WireBudget:
        return registry.register(WireBudget(b))

    yield install
    registry.unregister(WireBudget.name)


def _run(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def _sent(cache_dir) -> float:
    a = analyse_run(RUN, parts=("collectives",), load_options={"cache_dir": cache_dir})
    return float(a.collectives.groupby("rank")["wire_bytes"].sum().max())


def test_a_registered_check_shows_in_every_output(budget, capsys, cache_dir, tmp_path):
    most = _sent(cache_dir)
    assert most > 0
    budget(most / 2)  # every rank breaks it
    flags = ["--cache-dir", str(cache_dir)]
    code, text = _run(["analyze", str(RUN), *flags], capsys)
    assert "bytes on the wire within the budget (wire_budget):" in text
    assert "FAIL ranks 0-1: sends" in text and "FAIL: 1 ranks over the budget" in text and code == 1
    code, out = _run(["analyze", str(RUN), *flags, "--format", "json"], capsys)
    report = json.loads(out)["checks"]["wire_budget"]
    assert code == 1 and report["verdict"]["status"] == "fail" and report["findings"][0]["ranks"] == [0, 1]
    # the gate: the sharding check passes, the registered one fails, and check exits 1
    code, text = _run(["check", str(RUN), *flags], capsys)
    assert "PASS: every tensor alive at the boundary is sharded" in text
    assert "FAIL: 1 ranks over the budget" in text and code == 1
    code, out = _run(["check", str(RUN), *flags, "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["ok"] and doc["checks"]["wire_budget"]["verdict"]["label"] == "FAIL"
    code, out = _run(["check", str(RUN), *flags, "--format", "junit"], capsys)
    suites = ET.fromstring(out).findall("testsuite")
    assert [s.get("name").split()[:2] for s in suites] == [["sptrace", "check"], ["sptrace", "wire_budget"]]
    assert suites[1].get("failures") == "2" and code == 1  # the finding and the verdict
    html = tmp_path / "report.html"
    assert main(["report", str(RUN), *flags, "--html", str(html)]) == 0
    page = html.read_text()
    assert "bytes on the wire within the budget (wire_budget) findings (1)" in page and "over-budget" in page
    assert "1 ranks over the budget" in page  # its badge's tooltip, beside the run's own two
    # the dashboard's overview card: the check's title and badge, its finding in the list
    from sptrace.dashboards.pages.overview import run_card
    from sptrace.dashboards.store import RunStore

    store = RunStore([RUN], options={"load_options": {"cache_dir": cache_dir}})
    card = json.dumps(run_card(store, 0, selected=True).to_plotly_json(), default=lambda o: o.to_plotly_json())
    assert '"check-wire_budget-0"' in card and "bytes on the wire within the budget" in card
    assert '"data-check": "wire_budget"' in card and "sends " in card  # the badge, and the finding listed


def test_a_budget_the_run_keeps_passes_and_unregistered_it_is_gone(budget, capsys, cache_dir):
    flags = ["--cache-dir", str(cache_dir)]
    budget(_sent(cache_dir) * 2)
    code, text = _run(["check", str(RUN), *flags], capsys)
    assert code == 0 and "PASS: every rank within" in text
    registry.unregister(WireBudget.name)
    code, text = _run(["check", str(RUN), *flags], capsys)
    assert code == 0 and "wire_budget" not in text
    code, out = _run(["analyze", str(RUN), *flags, "--format", "json"], capsys)
    assert "checks" not in json.loads(out)


def test_the_run_s_own_check_names_are_reserved():
    class Impostor(WireBudget):
        name = "sharding"

    with pytest.raises(ValueError):
        registry.register(Impostor(1.0))
