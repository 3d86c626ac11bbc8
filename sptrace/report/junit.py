"""The sharding verdict as JUnit XML (``sptrace check --format junit``), for CI: a test case per
module, and one for the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING
from xml.sax.saxutils import quoteattr

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sptrace.baseline import BaselineGate
    from sptrace.checks.registry import CheckReport
    from sptrace.checks.sharding_verdict import ShardingReport


def render_junit(report: ShardingReport, run: str | None = None, seconds: float | None = None,
                 started: str | None = None, others: Sequence[CheckReport] = ()) -> str:  # fmt: skip
    """JUnit XML: one test case per module (all ranks together), failed when that module keeps a
    full tensor, with the rank set in the message; one more case for the verdict itself. ``run``
    names the suite (``sptrace check RUN``); ``seconds`` (the whole check, its analysis included)
    is the suite's time and the verdict case's, ``started`` (ISO 8601) its timestamp. ``others``:
    the registered checks that gate CI, a suite each (_check_suite)."""
    saved = report.saved
    cases = []
    failures = 0
    modules = sorted({m or "<unknown module>" for m in saved["module"]}) if len(saved) else []
    for module in modules:
        bad = [f for f in report.findings if (f.module or "<unknown module>") == module]
        name = quoteattr(module)
        if bad:
            failures += 1
            text = quoteattr("; ".join(f.text() for f in bad))
            source = next((f.source for f in bad if f.source is not None), None)  # where the first stray was made
            at = "" if source is None else f' file={quoteattr(source.file)} line="{source.line}"'
            cases.append(f'    <testcase classname="sptrace.sharding" name={name}{at}><failure message={text}/>'
                         "</testcase>")  # fmt: skip
        else:
            cases.append(f'    <testcase classname="sptrace.sharding" name={name}/>')
    verdict = report.verdict
    name = quoteattr("verdict")
    timed = "" if seconds is None else f' time="{seconds:.3f}"'
    if verdict.status == "undecided":
        error = f"<error message={quoteattr(verdict.line())}/>"
        cases.append(f'    <testcase classname="sptrace.sharding" name={name}{timed}>{error}</testcase>')
    else:
        cases.append(f'    <testcase classname="sptrace.sharding" name={name}{timed}/>')
    errors = int(verdict.status == "undecided")
    suite = quoteattr("sptrace check" + (f" {run}" if run else ""))
    stamp = "" if started is None else f" timestamp={quoteattr(started)}"
    head = (f'  <testsuite name={suite} tests="{len(cases)}" failures="{failures}" errors="{errors}"'
            f"{timed}{stamp}>")  # fmt: skip
    suites = [line for other in others for line in _check_suite(other, run)]
    return "\n".join(['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>", head, *cases, "  </testsuite>",
                      *suites, "</testsuites>", ""])  # fmt: skip


def _check_suite(report: CheckReport, run: str | None) -> list[str]:
    """A registered check as a suite: a case per finding (failed when an error), one for its
    verdict (failed on FAIL, an error on CANNOT DECIDE)."""
    cls = quoteattr(f"sptrace.{report.name}")
    cases = []
    for i, f in enumerate(report.findings):
        name = quoteattr(f"{f.code} {i + 1}")
        failure = f"<failure message={quoteattr(f.text())}/>" if f.severity == "error" else ""
        cases.append(f"    <testcase classname={cls} name={name}>{failure}</testcase>")
    status = report.verdict.status if report.verdict is not None else "undecided"
    tag = {"fail": "failure", "undecided": "error"}.get(status)
    body = f"<{tag} message={quoteattr(report.line())}/>" if tag else ""
    cases.append(f'    <testcase classname={cls} name="verdict">{body}</testcase>')
    failures = sum(f.severity == "error" for f in report.findings) + int(status == "fail")
    suite = quoteattr(f"sptrace {report.name}" + (f" {run}" if run else ""))
    head = (
        f'  <testsuite name={suite} tests="{len(cases)}" failures="{failures}" errors="{int(status == "undecided")}">'
    )
    return [head, *cases, "  </testsuite>"]


def render_baseline_junit(gate: BaselineGate, seconds: float | None = None) -> str:
    """``check``/``analyze --baseline`` as JUnit XML: a case per module, failed when it keeps a
    full-size tensor the baseline did not keep or sends more bytes; one case for the verdict (an
    error when part of it could not be decided)."""
    cases = []
    for c in gate.cases:
        name = quoteattr(c.module)
        if c.failures:
            text = quoteattr("; ".join(c.failures))
            cases.append(f'    <testcase classname="sptrace.baseline" name={name}><failure message={text}/></testcase>')
        else:
            cases.append(f'    <testcase classname="sptrace.baseline" name={name}/>')
    timed = "" if seconds is None else f' time="{seconds:.3f}"'
    verdict = quoteattr("verdict")
    error = f"<error message={quoteattr(gate.line())}/>" if gate.exit_code == 2 else ""
    cases.append(f'    <testcase classname="sptrace.baseline" name={verdict}{timed}>{error}</testcase>'
                 if error else f'    <testcase classname="sptrace.baseline" name={verdict}{timed}/>')  # fmt: skip
    suite = quoteattr(f"sptrace baseline {gate.diff.base} -> {gate.diff.new}")
    head = (f'  <testsuite name={suite} tests="{len(cases)}" failures="{len(gate.failed)}" '
            f'errors="{int(bool(error))}"{timed}>')  # fmt: skip
    return "\n".join(
        ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>", head, *cases, "  </testsuite>", "</testsuites>", ""]
    )
