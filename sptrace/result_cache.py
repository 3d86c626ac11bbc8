"""Whole results of the commands that only read a run (``collectives``, ``analyze``, ``info``):
what one printed (stdout and stderr, in order) and its exit code, replayed when the same command
is run again on the same run with the same code.

A warm ``collectives`` or ``analyze`` of an unchanged run already reads each rank's summary
instead of parsing and detecting (sptrace.summary_cache); what it has left is a fresh process
importing pandas and pyarrow (about 0.9 s of the 1.2 s) and the cross-rank reduce. A replay
needs neither: this module and what it imports are the standard library.

A replayed result is a cached answer, and a stale one is a wrong answer, so the key is
everything the output depends on:

- the command line as parsed (every option, defaults included) but those that change only how
  the work is spread or cached (``NOT_KEYED``), and the path as given and resolved;
- the run: the name, size, mtime_ns and inode of every entry of its folder (the traces,
  ``run.json``, a file added or removed), or of the trace file and the ``run.json`` beside it;
- the ``--config`` file's bytes, and every ``SPTRACE_*`` environment variable;
- the code: a SHA-256 of all of the package's sources and the libraries they run on
  (sptrace.cachedir.sources_digest), so that any edit of sptrace is a miss.

Not replayed: ``check`` (the gate always judges; its ranks' summaries are cached), a command
with ``--no-cache``, one that writes a file (``--output``) or a timestamp (JUnit), one that
raised an error (nothing is kept), and ``sptrace.cli.main([...])`` called in-process, where code
may be patched beneath the digest: only the ``sptrace`` command itself replays.

Entries live in ``results/`` of the cache directory, written atomically, their bytes' CRC-32 in
their name (checked before use: a damaged entry is deleted, a miss), one per command line and
run (a newer version of the run's files or of the code replaces the older), within an eighth of the
cache's cap (SPTRACE_CACHE_MAX), least recently used first; an entry whose run is gone goes at
the next write. ``sptrace cache info`` counts them, ``sptrace cache clear`` empties them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sptrace.cachedir import max_bytes, sources_digest, sweep_temporaries, write_entry

RESULT_VERSION = 1
"""Bump when what a replay needs changes in a way the code digest cannot see."""

COMMANDS = frozenset({"collectives", "analyze", "info"})
NOT_KEYED = frozenset({"func", "argv", "command", "no_cache", "cache_dir", "workers", "executor", "scheduler"})
"""Parsed options that change how the work is spread or cached, never what is printed."""

SUBDIR = "results"
MAX_OUTPUT = 32 * 2**20
"""A larger output (``collectives --format json`` of thousands of ranks) is not kept: reading it
back saves little against printing it, and it would crowd the cap."""
_ENTRY = re.compile(r"^(?P<slot>[0-9a-f]{16})-(?P<version>[0-9a-f]{16})-(?P<crc>[0-9a-f]{8})\.result$")
"""An entry's name: the command's slot (its options, path, config and environment), the version of
its inputs (the run's files and the code) and its bytes' CRC-32. Keeping a result deletes the
slot's other versions: results of a run's older files or older code are never read again."""


@dataclass(frozen=True)
class Entry:
    path: Path
    bytes: int
    used: float
    source: str | None
    """The run the result is of (resolved)."""
    command: str

    @property
    def source_gone(self) -> bool:
        return self.source is None or not Path(self.source).exists()


def directory(cache_dir: str | os.PathLike[str] | None) -> Path:
    from sptrace.cachedir import default_cache_dir

    return (Path(cache_dir) if cache_dir else default_cache_dir()) / SUBDIR


def key_of(args: argparse.Namespace) -> str | None:
    """The key of this command's result, or None when it is not replayed (see the module's
    docstring) or its inputs cannot all be read (then the command runs, and says why)."""
    if getattr(args, "command", None) not in COMMANDS or getattr(args, "no_cache", False):
        return None
    if getattr(args, "output", None) or getattr(args, "format", None) == "junit":
        return None
    code = sources_digest(f"result {RESULT_VERSION}")
    if code is None:
        return None
    try:
        run = Path(args.path)
        config = getattr(args, "config", None)
        baseline = getattr(args, "baseline", None)  # analyze --baseline: that run's files count too
        inputs = {
            "path": [str(run), str(run.resolve())],
            "run": [_fingerprint(run), baseline and _fingerprint(Path(baseline))],
            "config": config and hashlib.sha256(Path(config).read_bytes()).hexdigest(),
        }
    except (OSError, ValueError):
        return None
    options = sorted((k, repr(v)) for k, v in vars(args).items() if k not in NOT_KEYED)
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("SPTRACE_"))
    slot = json.dumps([args.command, options, env, inputs["path"], inputs["config"]], default=str)
    version = json.dumps([code, inputs["run"]], default=str)
    return f"{_hex(slot)}-{_hex(version)}"


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _fingerprint(run: Path) -> list[list[Any]]:
    """The name, size, mtime_ns and inode of every entry the run's result can depend on."""
    if run.is_dir():
        names = sorted(os.listdir(run))
        files = [run / n for n in names]
    else:
        files = [run, run.parent / "run.json"]
    out: list[list[Any]] = [[str(run), os.stat(run).st_mtime_ns]]
    for p in files:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            out.append([p.name, None])
            continue
        out.append([p.name, st.st_size, st.st_mtime_ns, st.st_ino])
    return out


def replay(cache_dir: Path, key: str) -> int | None:
    """Print the kept result of ``key`` as it was first printed and return its exit code; None
    when there is none (or it is damaged: deleted)."""
    for entry in sorted(cache_dir.glob(f"{key}-*.result")) if cache_dir.is_dir() else []:
        try:
            data = entry.read_bytes()
            match = _ENTRY.match(entry.name)
            if match is None or zlib.crc32(data) != int(match.group("crc"), 16):
                raise ValueError("damaged")
            head, _, body = data.partition(b"\n")
            chunks, code = json.loads(body), int(json.loads(head)["exit_code"])
            os.utime(entry)  # used now: the least recently used go first
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        streams = {1: sys.stdout, 2: sys.stderr}
        for fd, text in chunks:
            streams[fd].write(text)
            streams[fd].flush()
        return code
    return None


class _Recorder:
    """A text stream that writes through to ``stream`` and keeps what it wrote in ``chunks``.
    A progress bar's redraws (carriage returns: tqdm over the ranks) pass through unkept."""

    def __init__(self, stream: TextIO, fd: int, chunks: list[tuple[int, str]]) -> None:
        self._stream, self._fd, self._chunks = stream, fd, chunks

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        if "\r" not in text:
            self._chunks.append((self._fd, text))
        return n

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding...: the stream's
        return getattr(self._stream, name)


@contextmanager
def recording() -> Iterator[list[tuple[int, str]]]:
    """Within the block, what is printed to stdout and stderr is also kept, in order."""
    chunks: list[tuple[int, str]] = []
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Recorder(out, 1, chunks), _Recorder(err, 2, chunks)  # type: ignore[assignment]
    try:
        yield chunks
    finally:
        sys.stdout, sys.stderr = out, err


def keep(cache_dir: Path, key: str, args: argparse.Namespace, chunks: list[tuple[int, str]], code: int) -> None:
    """Keep a result (atomically; nothing when the cache is not writable or the output is too
    large), then the results within their share of the cap."""
    merged: list[list[Any]] = []
    for fd, text in chunks:  # print() writes a line and its newline apart: one chunk per run of a stream
        if merged and merged[-1][0] == fd:
            merged[-1][1] += text
        else:
            merged.append([fd, text])
    head = {"source": str(Path(args.path).resolve()), "command": " ".join(getattr(args, "argv", []) or []),
            "exit_code": code}  # fmt: skip
    data = json.dumps(head).encode() + b"\n" + json.dumps(merged).encode()  # JSON escapes a newline: one line each
    if len(data) > MAX_OUTPUT:
        return
    try:
        entry = write_entry(cache_dir, data, lambda crc: f"{key}-{crc}.result")
        for stale in cache_dir.glob(f"{key.split('-')[0]}-*.result"):
            if stale != entry:
                stale.unlink(missing_ok=True)
        prune(cache_dir, keep=entry)
    except OSError:
        return


def entries(cache_dir: Path) -> list[Entry]:
    """The kept results, least recently used first."""
    out = []
    for p in cache_dir.iterdir() if cache_dir.is_dir() else []:
        if not _ENTRY.match(p.name):
            continue
        try:
            st = p.stat()
            with open(p, "rb") as f:
                head = json.loads(f.readline())
            source, command = head.get("source"), str(head.get("command", ""))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, AttributeError):
            source, command = None, ""
        out.append(Entry(p, st.st_size, st.st_mtime, source if isinstance(source, str) else None, command))
    return sorted(out, key=lambda e: e.used)


def prune(cache_dir: Path, *, keep: Path | None = None) -> None:
    """Drop results whose run is gone, then the least recently used past an eighth of the cap."""
    limit = max_bytes() // 8
    alive = []
    for e in entries(cache_dir):
        if e.path != keep and e.source_gone:
            e.path.unlink(missing_ok=True)
        else:
            alive.append(e)
    total = sum(e.bytes for e in alive)
    for e in alive:
        if total <= limit:
            break
        if e.path != keep:
            e.path.unlink(missing_ok=True)
            total -= e.bytes
    sweep_temporaries(cache_dir)


def clear(cache_dir: Path) -> int:
    """Delete every kept result; the bytes freed."""
    freed = 0
    for e in entries(cache_dir):
        freed += e.bytes
        e.path.unlink(missing_ok=True)
    try:
        cache_dir.rmdir()
    except OSError:  # not there, or holds what is not ours
        pass
    return freed
