"""How a run is read: the loader's options (LoadOptions, built once by the CLI or the caller) and
the per-rank map over the run's files (sptrace.run.map)."""

from sptrace.run.options import LoadOptions, LoadOptionValues

__all__ = ["LoadOptionValues", "LoadOptions"]
