"""The runs a dashboard serves: only those named on the command line, analysed once each on
first use (sptrace.analysis.analyse_run, the same analysis the CLI renders) and kept in memory.
Pages refer to runs by index, so no path from the browser ever reaches the filesystem.

An analysis is also kept on disk (sptrace.analysis_cache: keyed by the run's files, the options
and the code), so that a dashboard started again over a run it showed before reads it back in a
fraction of a second instead of reducing every rank again.

Each app has its own store (nothing module-global), and each run its own lock: the first request
for a slow run analyses it while requests for the other runs are answered."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from sptrace import analysis_cache
from sptrace.analysis import PARTS, RunAnalysis, analyse_run
from sptrace.lane_window import MAX_POINTS
from sptrace.sweep import Sweep, load_sweep
from sptrace.vocab.errors import SptraceError

T = TypeVar("T")

VIEW_PARTS = (*PARTS, "whatif")
"""What the dashboard analyses when the caller names no parts: analyse_run's own, and the replay graphs
of the Timeline's what-if (built from what the critical path already has: a few ms)."""
CACHED_OPTIONS = frozenset({"parts", "flags", "load_options"})
"""The options sptrace.analysis_cache keys: with only these, an analysis is kept on disk and read
back when the dashboard is started again over the same run (its first page at once)."""


class RunStore:
    def __init__(
        self, paths: list[Path], sweeps: list[Path] | None = None, analyses: list[RunAnalysis] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.paths = [Path(p) for p in paths]
        # analyse_run's: the model flags and load options, and the parts (VIEW_PARTS unless the caller names them)
        self.analyse_options = {"parts": VIEW_PARTS, **(options or {})}
        self.sweeps = [Path(p) for p in sweeps or []]
        self._cache: dict[tuple[int, str], object] = {(i, "run"): a for i, a in enumerate(analyses or [])}
        self._locks: dict[tuple[int, str], threading.Lock] = {}
        self._guard = threading.Lock()  # held only to look up / create a per-run lock
        self.timeline_points = MAX_POINTS
        """The most points the Timeline sends for one view (sptrace.lane_window)."""

    def __len__(self) -> int:
        return len(self.paths)

    def name(self, index: int) -> str:
        path = self.paths[index]
        return path.name or str(path)

    def options(self) -> list[dict[str, str]]:
        """For Mantine's Select: values are strings."""
        return [{"label": self.name(i), "value": str(i)} for i in range(len(self.paths))]

    def _once(self, key: tuple[int, str], compute: Callable[[], T]) -> T:
        """``compute()``'s value, computed once per key (each key holds one type of value)."""
        with self._guard:
            if key in self._cache:
                return cast(T, self._cache[key])
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one computation per key; other keys go on meanwhile
            if key not in self._cache:
                self._cache[key] = compute()
            return cast(T, self._cache[key])

    def cached(self, index: int, key: str, compute: Callable[[], T]) -> T:
        """A further analysis of one run (HTA's, a diff with another run), computed once."""
        return self._once((index, key), compute)

    def sweep(self, index: int) -> Sweep | None:
        """The ``index``-th sweep folder's table, fit and predictions, read once (None: not a sweep)."""
        return self._once((index, "sweep"), lambda: load_sweep(self.sweeps[index]))

    def warm(self) -> threading.Thread:
        """Analyse every run in the background, in order, so that the first page is ready when
        the browser asks (a page asking for a run first takes its turn: one lock per run)."""
        thread = threading.Thread(target=lambda: [self.get(i) for i in range(len(self.paths))], daemon=True,
                                  name="sptrace-warm")  # fmt: skip
        thread.start()
        return thread

    def get(self, index: int | str | None) -> RunAnalysis | SptraceError:
        """The run's analysis, or the error that made it unusable."""
        try:
            index = int(index)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return SptraceError(f"no such run: {index!r}")
        if not 0 <= index < len(self.paths):
            return SptraceError(f"no such run: {index} (this dashboard serves {len(self.paths)})")

        def analyse() -> RunAnalysis | SptraceError:
            try:
                if set(self.analyse_options) <= CACHED_OPTIONS:  # read back when this run was shown before
                    return analysis_cache.analyse(self.paths[index], **self.analyse_options)  # type: ignore[arg-type]
                return analyse_run(self.paths[index], **self.analyse_options)
            except SptraceError as exc:  # its message names the file and the problem
                return exc

        return self._once((index, "run"), analyse)
