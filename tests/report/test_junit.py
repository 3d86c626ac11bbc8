"""GIVEN the committed 2-rank megatron run with a stray full-size save (tests/golden/runs)
WHEN `sptrace check --format junit` writes its verdict (sptrace.report.junit), which the golden set
does not record (it holds a wall-clock time)
THEN there is one case per module, the stray save's failed with its ranks, and one for the verdict."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from sptrace.cli import main
from tests.golden.make_golden import RUNS


def test_one_case_per_module_and_one_for_the_verdict(cache_dir: Path, capsys):
    run = RUNS / "megatron-stray-full-save"
    assert main(["check", str(run), "--format", "junit", "--cache-dir", str(cache_dir)]) == 1
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert suite.get("name") == f"sptrace check {run}" and suite.get("timestamp")
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["layers.0.mlp.fc1"]
    assert failed[0].find("failure").get("message").startswith("ranks 0-1: layers.0.mlp.fc1 keeps a full-sequence")
    assert cases[-1].get("name") == "verdict" and float(cases[-1].get("time")) > 0
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == (str(len(cases)), "1", "0")
