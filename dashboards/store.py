"""The runs a dashboard serves: only those named on the command line, analysed once each on
first use (sptrace.analysis.analyse_run, the same analysis the CLI renders) and kept in memory.
Pages refer to runs by index, so no path from the browser ever reaches the filesystem."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sptrace.analysis import RunAnalysis, analyse_run
from sptrace.errors import SptraceError


class RunStore:
    def __init__(
        self, paths: list[Path], sweeps: list[Path] | None = None, analyses: list[RunAnalysis] | None = None
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.sweeps = [Path(p) for p in sweeps or []]
        self._cache: dict[int, RunAnalysis | SptraceError] = dict(enumerate(analyses or []))
        self._extra: dict[tuple[int, str], Any] = {}
        self._lock = threading.Lock()

    def options(self) -> list[dict[str, Any]]:
        return [{"label": p.name or str(p), "value": i} for i, p in enumerate(self.paths)]

    def cached(self, index: int, key: str, compute: Any) -> Any:
        """A further analysis of one run (HTA's), computed once."""
        with self._lock:
            if (index, key) not in self._extra:
                self._extra[(index, key)] = compute()
            return self._extra[(index, key)]

    def get(self, index: int | None) -> RunAnalysis | SptraceError:
        """The run's analysis, or the error that made it unusable."""
        if index is None or not 0 <= int(index) < len(self.paths):
            return SptraceError("no such run")
        index = int(index)
        with self._lock:
            if index not in self._cache:
                try:
                    self._cache[index] = analyse_run(self.paths[index])
                except SptraceError as exc:  # its message names the file and the problem
                    self._cache[index] = exc
            return self._cache[index]
