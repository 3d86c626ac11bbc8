"""Per-rank tables -> collectives and retained allocations (the second stage)."""

from sptrace.detect.collectives import COLUMNS, detect_collectives

__all__ = ["COLUMNS", "detect_collectives"]
