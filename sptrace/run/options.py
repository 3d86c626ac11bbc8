"""The loader's options, typed and built once: by the CLI from its flags (sptrace.cli.common), or by
a Python caller, then passed down unchanged to the map over ranks (sptrace.run.map), the cache and
the executor."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from sptrace.cachedir import default_cache_dir
from sptrace.run.executors import Executor
from sptrace.vocab.errors import UsageError


class LoadOptionValues(TypedDict, total=False):
    """The options as the Python API takes them in a mapping (``LoadOptions.of``): ``workers``
    (local processes) stands for an executor."""

    cache: bool
    cache_dir: Path | str | None
    skip_bad: bool
    executor: Executor | None
    workers: int | None


@dataclass(frozen=True)
class LoadOptions:
    """``cache``: read and write parsed tables, summaries and results; ``cache_dir``: where
    (default: $XDG_CACHE_HOME/sptrace); ``skip_bad``: an unusable rank file is a warning, the
    rest analysed; ``executor``: where each rank is parsed and summarized."""

    cache: bool = True
    cache_dir: Path | None = None
    skip_bad: bool = False
    executor: Executor = field(default_factory=Executor)

    def __post_init__(self) -> None:
        if self.cache_dir is not None and not isinstance(self.cache_dir, Path):  # a str from a flag, once
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))

    @property
    def cache_root(self) -> Path:
        """The cache directory in effect."""
        return self.cache_dir or default_cache_dir()

    @classmethod
    def of(cls, given: LoadOptions | LoadOptionValues | None) -> LoadOptions:
        """``given`` itself, or the mapping the Python API takes (``cache``, ``cache_dir``,
        ``skip_bad``, and ``executor`` or ``workers``, local processes)."""
        if isinstance(given, LoadOptions):
            return given
        values = dict(given or {})
        workers = values.pop("workers", None)
        unknown = sorted(set(values) - {"cache", "cache_dir", "skip_bad", "executor"})
        if unknown:
            raise UsageError(f"unknown load options: {', '.join(unknown)}")
        if values.get("executor") is None:
            values["executor"] = Executor(workers=workers)
        return cls(**values)
