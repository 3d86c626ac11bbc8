"""GIVEN four ways a user's layer keeps the gathered sequence (tests/user_models/source_forms.py:
autograd saves a linear's gathered input, a list keeps a copy, a forward hook keeps a module's
output, dropout's mask on the gathered tensor), each profiled bare with Python stacks and under
sptrace.instrument, and once without stacks, on 8 gloo ranks
WHEN `sptrace check` FAILs each
THEN every FAIL names where the user's code made the kept tensor: under instrument the statement
itself (the line the model file marks ``# MADE: <form>``), in a bare trace the first line of the
function around it (what the Python tracer records); the text, JSON, JUnit and GitHub outputs all
carry it; and without stacks the FAIL says how to record them."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sptrace.cli import main
from tests.user_models import source_forms

SHAPE = ["--batch", "2", "--seq", "64", "--hidden", "48", "--sp", "8", "--workers", "1"]
MODEL_FILE = "tests/user_models/source_forms.py"


def _marked_lines() -> dict[str, int]:
    """form -> the line of the statement the model file marks ``# MADE: form``."""
    text = Path(source_forms.__file__).read_text().splitlines()
    return {m[1]: n for n, line in enumerate(text, 1) if (m := re.search(r"# MADE: (\w+)", line))}


MARKED = _marked_lines()
STATEMENT = {"saved": MARKED["gather"], "list": MARKED["list"], "hook": MARKED["hook"], "dropout": MARKED["dropout"]}
"""The statement that made each form's stray: the gather's buffer is what autograd saves."""
FIRST_LINE = {
    "saved": source_forms.Gather.forward.__code__.co_firstlineno,
    "list": source_forms.Block.forward.__code__.co_firstlineno,
    "hook": source_forms.Scaled.forward.__code__.co_firstlineno,
    "dropout": source_forms.Block.forward.__code__.co_firstlineno,
}
"""The function around each statement, at its first line (a decorator's line, where it has one)."""


def check(user_runs: Path, run: str, capsys, cache: Path, fmt: str) -> tuple[int, str]:
    code = main(["check", str(user_runs / "source_lines" / run), "--format", fmt, "--cache-dir", str(cache), *SHAPE])
    captured = capsys.readouterr()
    assert captured.out, captured.err
    return code, captured.out


def test_the_model_file_marks_four_distinct_statements():
    assert set(MARKED) == {"gather", "list", "hook", "dropout"}
    assert len(set(STATEMENT.values())) == 4
    assert all(FIRST_LINE[f] < STATEMENT[f] for f in source_forms.FORMS)


@pytest.mark.parametrize("form", source_forms.FORMS)
@pytest.mark.parametrize("how", ["instrumented", "bare"])
def test_each_fail_names_the_line_that_made_the_kept_tensor(user_runs, capsys, tmp_path, form, how):
    code, out = check(user_runs, f"{form}_{how}", capsys, tmp_path / "cache", "json")
    report = json.loads(out)
    assert code == 1, report["verdict"]
    findings = [f for f in report["findings"] if f["code"] == "full-size-save"]
    assert findings and all(f["layer"] == 1 for f in findings), findings
    want = STATEMENT[form] if how == "instrumented" else FIRST_LINE[form]
    for f in findings:
        assert f["source"] == {"file": MODEL_FILE, "line": want, "function": "forward",
                               "exact": how == "instrumented"}, f  # fmt: skip
        assert f["saver"].startswith("layers.1"), f["saver"]
    if form in ("saved", "dropout"):  # autograd keeps these: its node is the saver
        node = "AddmmBackward0" if form == "saved" else "MulBackward0"
        assert any(f"({node})" in f["saver"] for f in findings), [f["saver"] for f in findings]
    # every kept tensor's row carries its maker too, not only the FAIL's
    full = [s for s in report["saved"] if s["class"] == "full" and s["holder"] in ("autograd", "model")]
    assert full and all(s["made_file"] == MODEL_FILE and s["made_line"] == want for s in full)


def test_the_text_junit_and_github_outputs_carry_the_line(user_runs, capsys, tmp_path):
    line = STATEMENT["dropout"]
    code, text = check(user_runs, "dropout_instrumented", capsys, tmp_path / "c", "text")
    assert code == 1
    fails = [x for x in text.splitlines() if x.startswith("FAIL ranks")]
    assert fails and all(f"made at {MODEL_FILE}:{line} in forward(), kept by layers.1" in x for x in fails), fails

    code, xml = check(user_runs, "dropout_instrumented", capsys, tmp_path / "c", "junit")
    failed = [c for c in ET.fromstring(xml).iter("testcase") if c.find("failure") is not None]
    assert code == 1 and [(c.get("name"), c.get("file"), c.get("line")) for c in failed] == [
        ("layers.1", MODEL_FILE, str(line))]  # fmt: skip

    code, github = check(user_runs, "dropout_instrumented", capsys, tmp_path / "c", "github")
    commands = github.splitlines()
    # GitHub's syntax: ::kind key=value,...::message, ':' and ',' escaped in values, nothing multi-line
    grammar = re.compile(r"^::(error|warning|notice)( (\w+=[^,:]*)(,\w+=[^,:]*)*)?::[^\r\n]*$")
    assert code == 1 and commands and all(grammar.match(c) for c in commands), commands
    errors = [c for c in commands if c.startswith("::error file=")]
    assert len(errors) == 1 and errors[0].startswith(
        f"::error file={MODEL_FILE},line={line},title=sptrace check%3A layers.1 keeps a full-size tensor::ranks 0-7: "
    ), errors  # fmt: skip
    assert commands[-1].startswith("::error title=sptrace check::FAIL: 1 full-size tensor")


def test_a_trace_without_stacks_says_how_to_record_them(user_runs, capsys, tmp_path):
    code, text = check(user_runs, "saved_no_stack", capsys, tmp_path / "c", "text")
    fails = [x for x in text.splitlines() if x.startswith("FAIL ranks") or x.startswith("FAIL rank ")]
    assert code == 1 and fails
    assert all("no source line: the trace has no Python stacks; profile with with_stack=True" in x for x in fails)
    code, out = check(user_runs, "saved_no_stack", capsys, tmp_path / "c", "json")
    assert all(f["source"] is None and "with_stack=True" in f["no_source"] for f in json.loads(out)["findings"])


def test_the_html_report_and_the_memory_table_show_the_line(user_runs, tmp_path):
    from sptrace.dashboards.pages.memory import tensor_rows

    from sptrace.analysis import analyse_run
    from sptrace.report.html import render_html

    run = user_runs / "source_lines" / "hook_instrumented"
    a = analyse_run(run, flags={"batch": 2, "seq": 64, "hidden": 48, "sp_size": 8}, load_options={"workers": 1})
    where = f"{MODEL_FILE}:{STATEMENT['hook']} in forward()"
    rows = tensor_rows(a)
    full = rows[(rows["class"] == "full") & rows["holder"].isin(["model", "autograd"])]
    assert len(full) == 8 and set(full["made_at"]) == {where}, full[["rank", "made_at"]]
    page = render_html([(run, a)])
    assert f"made at {where}, kept by layers.1.scaled" in page
