"""Trace files -> per-rank event tables (the first stage of sptrace's data flow).

Its names are imported as they are asked for: sptrace.load.native, which starts decoding before
numpy and pyarrow are imported, is in this package (sptrace.cli reads a rank ahead)."""

from __future__ import annotations

from typing import Any

_LAZY = {
    "SCHEMA": "sptrace.load.schema",
    "SCHEMA_VERSION": "sptrace.load.schema",
    "RankTrace": "sptrace.load.trace",
    "RunTrace": "sptrace.load.trace",
    "TraceWarning": "sptrace.load.trace",
    "load_trace": "sptrace.load.trace",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sptrace.load' has no attribute {name!r}")
