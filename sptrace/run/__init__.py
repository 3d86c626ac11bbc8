"""How a run is read: the loader's options (LoadOptions, built once by the CLI or the caller), where
the per-rank work runs (executors.py: this process, worker processes, Dask), a function over every
rank file of a run (ranks.py: map_files, load_run), and the per-rank map (map.py) with its summaries
kept in the cache (summaries.py)."""

from sptrace.run.options import LoadOptions, LoadOptionValues

__all__ = ["LoadOptionValues", "LoadOptions"]
