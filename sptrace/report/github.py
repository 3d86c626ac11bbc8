"""The gate's verdict as GitHub Actions workflow commands (``sptrace check --format github``): an
``::error`` per FAIL on the file and line that made the kept tensor, so that the finding shows on
the pull request's diff, a ``::warning`` per reason the gate could not decide, and a ``::notice``
for a pass. The commands' syntax and escapes are GitHub's (actions/toolkit's command.ts): ``%``,
CR and LF escaped in the message, and ``:`` and ``,`` too in a property's value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sptrace.checks.findings import Finding
    from sptrace.checks.registry import CheckReport
    from sptrace.checks.sharding_verdict import ShardingReport


def render_github(report: ShardingReport, others: Sequence[CheckReport] = ()) -> str:
    """One workflow command per line: the sharding check's, then each gating check's."""
    lines = [_finding_command(f, "sptrace check") for f in report.findings]
    lines += _verdict_commands(report.verdict.status, report.verdict.line(), report.verdict.reasons, "sptrace check")
    for other in others:
        title = f"sptrace {other.name}"
        lines += [_finding_command(f, title) for f in other.findings if f.severity == "error"]
        verdict = other.verdict
        if verdict is not None:
            lines += _verdict_commands(verdict.status, other.line(), verdict.reasons, title)
    return "\n".join(lines) + "\n"


def _finding_command(finding: Finding, title: str) -> str:
    kind = "error" if finding.severity == "error" else "warning"
    props = {}
    if finding.source is not None:
        props["file"], props["line"] = finding.source.file, str(finding.source.line)
    what = f"{finding.module} keeps a full-size tensor" if finding.code == "full-size-save" and finding.module else (
        finding.code)  # fmt: skip
    props["title"] = f"{title}: {what}"
    return command(kind, finding.text(), props)


def _verdict_commands(status: str, line: str, reasons: Sequence[str], title: str) -> list[str]:
    if status == "undecided":
        return [command("warning", reason, {"title": f"{title}: cannot decide"}) for reason in reasons or (line,)]
    return [command("error" if status == "fail" else "notice", line, {"title": title})]


def command(kind: str, message: str, properties: dict[str, str]) -> str:
    """``::kind key=value,...::message`` with GitHub's escapes."""
    props = ",".join(f"{k}={_escape_property(v)}" for k, v in properties.items())
    return f"::{kind}{' ' + props if props else ''}::{_escape_data(message)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
