"""Trace files -> per-rank event tables (the first stage of sptrace's data flow)."""

from sptrace.load.schema import SCHEMA, SCHEMA_VERSION
from sptrace.load.trace import RankTrace, RunTrace, TraceWarning, load_trace

__all__ = ["SCHEMA", "SCHEMA_VERSION", "RankTrace", "RunTrace", "TraceWarning", "load_trace"]
