"""GIVEN findings of the gate, with and without the line that made the tensor
WHEN `sptrace check --format github` renders them
THEN each is one GitHub workflow command on one line, its file and line as properties, with
GitHub's escapes (``%``, CR, LF in the message; ``:`` and ``,`` too in a property's value)."""

from __future__ import annotations

from types import SimpleNamespace

from sptrace.checks.findings import Finding, Verdict
from sptrace.report.github import command, render_github
from sptrace.vocab.source_lines import SourceLine


def test_command_escapes_as_githubs_toolkit_does():
    assert command("error", "50% of\r\nit", {"file": "a,b:c.py", "line": "7", "title": "t: x"}) == (
        "::error file=a%2Cb%3Ac.py,line=7,title=t%3A x::50%25 of%0D%0Ait"
    )
    assert command("notice", "ok", {}) == "::notice::ok"


def _report(findings, verdict):
    return SimpleNamespace(findings=findings, verdict=verdict)


def test_a_fail_is_an_error_on_the_line_that_made_the_tensor():
    made = SourceLine("models/block.py", 76, "forward", exact=True)
    stray = Finding("error", "sharding", "full-size-save", "layers.1 keeps a full-sequence tensor", (0, 1, 2), 1,
                    "layers.1", source=made, saver="layers.1 (MulBackward0)")  # fmt: skip
    bare = Finding("error", "sharding", "full-size-save", "layers.2 keeps one", (3,), 2, "layers.2",
                   no_source="no source line: profile with with_stack=True")  # fmt: skip
    out = render_github(_report([stray, bare], Verdict("fail", "FAIL", "2 full-size tensors kept")))
    lines = out.splitlines()
    assert lines == [
        "::error file=models/block.py,line=76,title=sptrace check%3A layers.1 keeps a full-size tensor::ranks 0-2: "
        "layers.1 keeps a full-sequence tensor; made at models/block.py:76 in forward(), kept by layers.1 "
        "(MulBackward0)",
        "::error title=sptrace check%3A layers.2 keeps a full-size tensor::rank 3: layers.2 keeps one; no source "
        "line: profile with with_stack=True",
        "::error title=sptrace check::FAIL: 2 full-size tensors kept",
    ]  # fmt: skip


def test_cannot_decide_is_a_warning_per_reason_and_pass_a_notice():
    undecided = Verdict("undecided", "CANNOT DECIDE", "first", ("first", "second, with: colons"))
    assert render_github(_report([], undecided)).splitlines() == [
        "::warning title=sptrace check%3A cannot decide::first",
        "::warning title=sptrace check%3A cannot decide::second, with: colons",
    ]
    assert render_github(_report([], Verdict("pass", "PASS", "all sharded"))) == (
        "::notice title=sptrace check::PASS: all sharded\n"
    )
