"""A run's files, found once (RunFiles): the trace files of a folder (else the one file, else the
list given), those skipped and why, and the run.json beside them, read.

A folder's ``.json`` / ``.json.gz`` files are its traces, but for HTA's outputs and the files whose
name and first bytes show they are no trace (a config, metrics, a truth file). ``holds_any`` probes a
trace's text before it is parsed, for what a check needs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from sptrace.vocab.errors import TraceError

TRACE_SUFFIXES = (".json", ".json.gz")
RUN_FILE = "run.json"
RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
"""A rank in a trace's file name: ``rank3``, ``rank-3``, ``worker3``."""

RunSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""What names a run: its folder, one trace file, or a list of trace files."""


class RunInfo(TypedDict, total=False):
    """The run.json beside a run's traces (written by sptrace.profile_step), of which sptrace reads
    the model's fields: under ``config`` as profile_step writes them, or at the top of a flat one
    written by hand (read as a mapping by whoever declares the model)."""

    config: Mapping[str, object]


_SNIFF = 64 * 1024
# keys a Kineto trace starts with (the profiler writes schemaVersion, deviceProperties and
# distributedInfo before traceEvents; a trace written by other tools may open on traceEvents)
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')


def _named_like_a_trace(name: str) -> bool:
    """A name that says rank or trace (rank3.json, worker_0.pt.trace.json): read as a trace
    whatever it holds, so that a broken trace is an error, never skipped."""
    return bool(RANK_IN_NAME.search(name)) or "trace" in name.lower()


def _starts_like_a_trace(path: Path) -> bool:
    """Another .json beside the traces (a config, metrics, a truth file) is no trace: read its
    first bytes (inflated for .gz) for a trace's top-level keys."""
    import gzip

    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                head = f.read(_SNIFF)
        else:
            with open(path, "rb") as f:
                head = f.read(_SNIFF)
    except (OSError, EOFError, gzip.BadGzipFile):
        return True  # unreadable: loading it says why
    return any(key in head for key in _TRACE_KEYS)


def holds_any(path: Path, needles: tuple[bytes, ...], chunk: int = 1 << 20) -> set[bytes]:
    """Which of ``needles`` the file's text holds, read as a stream (inflated when gzip, by its
    magic number) and stopped once all are found: a probe before the parse, for what a check
    needs (``[memory]`` events), where no header says whether the profiler recorded them.
    Unreadable files answer every needle: loading them says what is wrong."""
    import gzip
    import zlib

    found: set[bytes] = set()
    keep = max(len(n) for n in needles) - 1
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gz else open(path, "rb") as f:
            tail = b""
            while len(found) < len(needles):
                block = f.read(chunk)
                if not block:
                    break
                data = tail + block
                found.update(n for n in needles if n in data)
                tail = data[-keep:] if keep else b""
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return set(needles)
    return found


def find_traces(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Trace files in a run folder, and the files skipped (HTA's outputs)."""
    if not root.exists():
        raise TraceError(root, "no such file or directory")
    files, skipped = [], []
    for p in sorted(root.iterdir()):
        if not p.is_file() or p.name == RUN_FILE or p.name.startswith("."):
            continue
        if not p.name.endswith(TRACE_SUFFIXES):
            continue
        if "_with_counters" in p.name:
            skipped.append((p, "written by HTA's generate_trace_with_counters, not a profiler trace"))
            continue
        if not _named_like_a_trace(p.name) and not _starts_like_a_trace(p):
            skipped.append((p, f"not a profiler trace (no trace key among its first {_SNIFF // 1024} KiB)"))
            continue
        files.append(p)
    if not files:
        raise TraceError(root, "no trace files (*.json, *.json.gz) in this directory")
    return files, skipped


@dataclass(frozen=True)
class RunFiles:
    """A run's files, found once: the trace files of a folder (else the one file, else the list
    given), those skipped and why, and the run.json beside them, read (its problems in
    ``notes``)."""

    root: Path | None
    """The run's folder (a single file's own folder; None for a list of files)."""
    files: tuple[Path, ...]
    skipped: tuple[tuple[Path, str], ...]
    run_info: RunInfo | None
    notes: tuple[str, ...]

    @property
    def single_file(self) -> bool:
        """The run is one file: a trace that names no rank is rank 0 of 1 (load_trace's ``alone``)."""
        return len(self.files) == 1

    @classmethod
    def scan(cls, path_or_files: RunSource) -> RunFiles:
        """A folder, one trace file, or a list of trace files (TraceError when there is no trace)."""
        root, files, skipped = files_of(path_or_files)
        notes: list[str] = []
        run_info = read_run_info(root, notes)
        return cls(root, tuple(files), tuple(skipped), run_info, tuple(notes))


def files_of(path_or_files: RunSource) -> tuple[Path | None, list[Path], list[tuple[Path, str]]]:
    """(the run's folder, its trace files, the files skipped and why)."""
    if isinstance(path_or_files, (str, os.PathLike)):
        root = Path(path_or_files)
        if root.is_dir():
            files, skipped = find_traces(root)
            return root, files, skipped
        if not root.exists():
            raise TraceError(root, "no such file or directory")
        return root.parent, [root], []
    files = [Path(p) for p in path_or_files]
    if not files:
        raise TraceError("<run>", "no trace files given")
    for p in files:
        if not p.is_file():
            raise TraceError(p, "no such file")
    return None, files, []


def read_run_info(root: Path | None, notes: list[str]) -> RunInfo | None:
    """The run's run.json (written by sptrace.profile_step), when there is one; a broken one is
    a note, not an error."""
    if root is None or not (root / RUN_FILE).is_file():
        return None
    try:
        info = json.loads((root / RUN_FILE).read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"ignored {root / RUN_FILE}: {exc}")
        return None
    if not isinstance(info, dict):
        notes.append(f"ignored {root / RUN_FILE}: not a JSON object")
        return None
    unread = _unread_keys(info)
    if unread:  # a misspelt size must not be silently unknown
        notes.append(f"{root / RUN_FILE}: {', '.join(unread)} {'is' if len(unread) == 1 else 'are'} no model field "
                     "sptrace reads (ignored); the fields are those of --config (README: run.json)")  # fmt: skip
    return cast(RunInfo, info)


# what sptrace.profile_step writes beside the model's fields, at the top and under config
_RUN_KEYS = frozenset({"backend", "config", "created", "device", "host", "profiled_step", "profiler", "schema",
                       "sptrace_version", "torch_version", "traces", "world_size"})  # fmt: skip
_CONFIG_KEYS = frozenset({"fault", "fault_layer", "fault_modules", "instrumented", "layout", "reference_model", "seed"})


def _unread_keys(info: Mapping[str, object]) -> list[str]:
    """The keys of a run.json that name no model field: under ``config`` (as profile_step writes
    it), or at the top of a flat one."""
    from sptrace.vocab.shape import ALIASES, FIELDS

    def field(key: str) -> bool:
        name = str(key).replace("-", "_")
        return ALIASES.get(name, name) in FIELDS

    config = info.get("config")
    if isinstance(config, dict):
        return sorted(str(k) for k in config if not field(k) and k not in _CONFIG_KEYS)
    return sorted(str(k) for k in info if not field(k) and k not in _RUN_KEYS and k not in _CONFIG_KEYS)
