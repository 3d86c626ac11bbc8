"""Whole results of the commands that only read a run (``collectives``, ``analyze``, ``info``, ``whatif``):
what one printed (stdout and stderr, in order) and its exit code, replayed when the same command
is run again on the same run with the same code.

A warm ``collectives`` or ``analyze`` of an unchanged run already reads each rank's summary
instead of parsing and detecting (sptrace.run.summaries); what it has left is a fresh process
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

Entries live in ``results/`` of the cache directory (a sptrace.cachedir.Store), written
atomically, their bytes' CRC-32 in their name (checked before use: a damaged entry is deleted, a
miss), one per command line and
run (a newer version of the run's files or of the code replaces the older), within an eighth of the
cache's cap (SPTRACE_CACHE_MAX), least recently used first; an entry whose run is gone goes at
the next write. ``sptrace cache info`` counts them, ``sptrace cache clear`` empties them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from sptrace.cachedir import (
    Entry,
    EntryHeader,
    Store,
    default_cache_dir,
    frame,
    keyed_answers,
    run_fingerprint,
    sources_digest,
    unframe,
)

RESULT_VERSION = 1
"""Bump when what a replay needs changes in a way the code digest cannot see."""

COMMANDS = frozenset({"collectives", "analyze", "info", "whatif"})
NOT_KEYED = frozenset({"func", "argv", "command", "no_cache", "cache_dir", "workers", "executor", "scheduler"})
"""Parsed options that change how the work is spread or cached, never what is printed."""

SUBDIR = "results"
SHARE = 8
"""The results may hold an eighth of the cache's cap."""
MAX_OUTPUT = 32 * 2**20
"""A larger output (``collectives --format json`` of thousands of ranks) is not kept: reading it
back saves little against printing it, and it would crowd the cap."""
_MAGIC = b"sptrace-result\n"
RESULTS = keyed_answers("result", _MAGIC)
"""An entry's name: the command's slot (its options, path, config and environment), the version of
its inputs (the run's files and the code) and its bytes' CRC-32. Keeping a result deletes the
slot's other versions: results of a run's older files or older code are never read again. Its
bytes are framed (sptrace.cachedir.frame): a header (``source``, ``command``, ``exit_code``), then
what was printed, as JSON."""

Printed = list[tuple[int, str]]
"""What a command printed, in order: (1 for stdout or 2 for stderr, text)."""


def directory(cache_dir: str | os.PathLike[str] | None) -> Path:
    return (Path(cache_dir) if cache_dir else default_cache_dir()) / SUBDIR


def store(results_dir: Path) -> Store:
    """The kept results in ``results_dir`` (``directory``'s answer), within their share of the cap."""
    return Store(results_dir, (RESULTS,), share=SHARE)


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
            "run": [run_fingerprint(run), baseline and run_fingerprint(Path(baseline))],
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


def _printed(data: bytes) -> tuple[Printed, int]:
    """(what a kept result printed, its exit code); ValueError, KeyError or TypeError when the
    entry is none."""
    header, start = unframe(_MAGIC, data)
    chunks = [(int(fd), str(text)) for fd, text in json.loads(data[start:])]
    return chunks, int(header["exit_code"])


def replay(cache_dir: Path, key: str) -> int | None:
    """Print the kept result of ``key`` as it was first printed and return its exit code; None
    when there is none (or it is damaged: deleted)."""
    found = store(cache_dir).read(f"{key}-", RESULTS, _printed)
    if found is None:
        return None
    chunks, code = found[1]
    streams = {1: sys.stdout, 2: sys.stderr}
    for fd, text in chunks:
        streams[fd].write(text)
        streams[fd].flush()
    return code


class _Recorder:
    """A text stream that writes through to ``stream`` and keeps what it wrote in ``chunks``.
    A progress bar's redraws (carriage returns: tqdm over the ranks) pass through unkept."""

    def __init__(self, stream: TextIO, fd: int, chunks: Printed) -> None:
        self._stream, self._fd, self._chunks = stream, fd, chunks

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        if "\r" not in text:
            self._chunks.append((self._fd, text))
        return n

    def __getattr__(self, name: str) -> object:  # flush, fileno, isatty, encoding...: the stream's
        return getattr(self._stream, name)


@contextmanager
def recording() -> Iterator[Printed]:
    """Within the block, what is printed to stdout and stderr is also kept, in order."""
    chunks: Printed = []
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Recorder(out, 1, chunks), _Recorder(err, 2, chunks)  # type: ignore[assignment]
    try:
        yield chunks
    finally:
        sys.stdout, sys.stderr = out, err


def keep(cache_dir: Path, key: str, args: argparse.Namespace, chunks: Printed, code: int) -> None:
    """Keep a result (atomically; nothing when the cache is not writable or the output is too
    large), then the results within their share of the cap."""
    merged: Printed = []
    for fd, text in chunks:  # print() writes a line and its newline apart: one chunk per run of a stream
        if merged and merged[-1][0] == fd:
            merged[-1] = (fd, merged[-1][1] + text)
        else:
            merged.append((fd, text))
    head = EntryHeader(source=str(Path(args.path).resolve()), command=" ".join(getattr(args, "argv", []) or []),
                       exit_code=code)  # fmt: skip
    data = frame(_MAGIC, head, json.dumps(merged).encode())
    if len(data) > MAX_OUTPUT:
        return
    store(cache_dir).put(f"{key}-", RESULTS, data, replaces=f"{key.split('-')[0]}-")


def entries(cache_dir: Path) -> list[Entry]:
    """The kept results, least recently used first (``header["command"]``: the command line)."""
    return store(cache_dir).entries()


def clear(cache_dir: Path) -> int:
    """Delete every kept result, and the folder once empty; the bytes freed."""
    freed = store(cache_dir).clear()
    try:
        cache_dir.rmdir()
    except OSError:  # not there, or holds what is not ours
        pass
    return freed
