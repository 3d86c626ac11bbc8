"""Observed versus expected -> Findings (the third stage)."""

from sptrace.checks.comm import CommReport, check_collectives
from sptrace.checks.findings import Finding

__all__ = ["CommReport", "Finding", "check_collectives"]
