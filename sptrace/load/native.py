"""The native decoder (sptrace/load/_kineto.c) over a trace file's pieces, and one file read ahead.

``native_columns(path)`` reads a file as it inflates, through one buffer, into the decoder's
columns (sptrace.load.decode turns them into the table). The decoder reads each piece with the
GIL released, so a file can be decoded on a thread while the process does something else:
``read_ahead(path)`` starts that, and the next ``native_columns`` of the same file takes what the
thread made. The command line reads the first rank ahead while it imports numpy, pyarrow and
pandas, which is most of a small command's time (sptrace.cli.main).

This module imports neither numpy nor pyarrow: it runs before them.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sptrace.load.pieces import PIECE_BYTES, TraceText, carry_over

try:  # built where a C compiler was at hand
    from sptrace.load import _kineto
except ImportError:  # pragma: no cover - installed without a compiler: msgspec alone
    _kineto = None


def native_decoder() -> bool:
    """Whether traces go through the native decoder first: it is built, and SPTRACE_DECODER is
    not ``msgspec`` (which benchmarks and tests use to compare the two)."""
    return _kineto is not None and os.environ.get("SPTRACE_DECODER", "") != "msgspec"


def native_columns(path: Path, piece_bytes: int = PIECE_BYTES) -> dict[str, Any] | None:
    """The native decoder's columns of the file, or None where it declines; what a read-ahead of
    the same file made, when there is one (its TraceError raised here, as if read here)."""
    ahead = _take(path)
    if ahead is None:
        return _columns(path, piece_bytes)
    if ahead.error is not None:
        raise ahead.error
    return ahead.columns


def _columns(path: Path, piece_bytes: int, stop: threading.Event | None = None) -> dict[str, Any] | None:
    """The file read as it inflates (its text is never whole in memory: a rank's load peaks at
    the columns, not the text beside them). One buffer takes every piece: the tail of a piece that
    holds no whole event moves to its front, and the next bytes are read after it (the buffer
    grows for a longer event). ``stop``: set, the reading ends at the next piece (None)."""
    assert _kineto is not None
    decoder = _kineto.Decoder()
    buffer = bytearray(piece_bytes)
    view = memoryview(buffer)
    kept = 0
    try:
        with TraceText(path) as text:
            while got := text.read_into(view[kept:]):
                if stop is not None and stop.is_set():
                    return None
                end = kept + got
                used = decoder.feed(view[:end])
                if used < 0:
                    return None
                view, kept = carry_over(buffer, view, used, end)
            if decoder.feed(view[:kept], last=True) < 0:
                return None
    finally:
        view.release()
    return decoder.finish()


# ---- one file read ahead -------------------------------------------------------------------


@dataclass
class _ReadAhead:
    path: Path
    identity: tuple[int, int, int, int]
    """The file's device, inode, size and mtime when the reading began: a taker names the same
    file by any path, and a file replaced since is read again."""
    stop: threading.Event = field(default_factory=threading.Event)
    columns: dict[str, Any] | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            self.columns = _columns(self.path, PIECE_BYTES, self.stop)
        except BaseException as exc:  # (a TraceError, MemoryError: the taker raises it)
            self.error = exc


_pending: _ReadAhead | None = None
_lock = threading.Lock()


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_ahead(path: Path) -> bool:
    """Decode ``path`` on a thread, for the next ``native_columns`` of the same file; any read-ahead
    nobody took is dropped first (one at a time: a rank's columns are the load's peak). False
    where the native decoder is off or the file cannot be read (the taker then says why)."""
    global _pending
    drop_read_ahead()
    identity = _identity(path)
    if not native_decoder() or identity is None:
        return False
    ahead = _ReadAhead(Path(path), identity)
    ahead.thread = threading.Thread(target=ahead.run, name="sptrace-read-ahead", daemon=True)
    ahead.thread.start()  # (before it is published: a taker joins a started thread)
    with _lock:
        _pending = ahead
    return True


def _take(path: Path) -> _ReadAhead | None:
    """The read-ahead of ``path``, once done; None when there is none of it (one of another file
    is dropped: the process went on without it)."""
    global _pending
    with _lock:
        ahead, _pending = _pending, None
    if ahead is None:
        return None
    if _identity(path) != ahead.identity:
        _stop(ahead)
        return None
    assert ahead.thread is not None
    ahead.thread.join()
    return ahead


def drop_read_ahead() -> None:
    """Stop a read-ahead nobody took, and wait for its thread (it reads no further piece)."""
    global _pending
    with _lock:
        ahead, _pending = _pending, None
    if ahead is not None:
        _stop(ahead)


def _stop(ahead: _ReadAhead) -> None:
    ahead.stop.set()
    assert ahead.thread is not None
    ahead.thread.join()
    ahead.columns = None


atexit.register(drop_read_ahead)  # (a daemon thread left inside the decoder at exit could not end cleanly)
