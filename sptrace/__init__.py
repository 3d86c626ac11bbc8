"""sptrace: a trace profiler and analyzer for sequence-parallel transformer training.

The instrumentation API needs torch and is imported lazily, so that the analyzer and the CLI
start without importing torch."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "instrument": "sptrace.instrumentation",
    "phase": "sptrace.instrumentation",
    "annotate": "sptrace.instrumentation",
    "profile_step": "sptrace.profiling",
    "assert_sequence_sharded": "sptrace.checks.live",
    "ShardingViolation": "sptrace.checks.live",
    "load_trace": "sptrace.load",
    "load_run": "sptrace.run.ranks",
    "RankTrace": "sptrace.load",
    "RunTrace": "sptrace.load",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sptrace' has no attribute {name!r}")
