"""The runs a dashboard serves: only those named on the command line, analysed once each on
first use and kept in memory. Pages refer to runs by index, so no path from the browser ever
reaches the filesystem."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sptrace.errors import SptraceError
from sptrace.pipeline import analyse_run


class RunStore:
    def __init__(self, paths: list[Path], sweeps: list[Path] | None = None) -> None:
        self.paths = [Path(p) for p in paths]
        self.sweeps = [Path(p) for p in sweeps or []]
        self._cache: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def options(self) -> list[dict[str, Any]]:
        return [{"label": p.name or str(p), "value": i} for i, p in enumerate(self.paths)]

    def cached(self, index: int, key: str, compute: Any) -> Any:
        """A further analysis of one run (HTA's), computed once."""
        entry = self.get(index)
        with self._lock:
            if key not in entry:
                entry[key] = compute()
            return entry[key]

    def get(self, index: int | None) -> dict[str, Any]:
        """The run's analyses, or {"error": one line} when it cannot be loaded."""
        if index is None or not 0 <= int(index) < len(self.paths):
            return {"error": "no such run"}
        index = int(index)
        with self._lock:
            if index not in self._cache:
                try:
                    self._cache[index] = analyse_run(self.paths[index])
                except SptraceError as exc:
                    self._cache[index] = {"error": str(exc), "path": self.paths[index]}
            return self._cache[index]
