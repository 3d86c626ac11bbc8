"""A trace file's JSON text in pieces, inflated as it is read, through one buffer: what lets the
native decoder read a rank without ever holding its text whole (sptrace/load/_kineto.c,
``Decoder.feed``), and without a new allocation (and its page faults) per piece.

The same checks as a whole read (``decode.read_bytes``): gzip by its magic number, not by the
file's name; an empty file, a truncated stream and corrupt data are each one TraceError naming the
file.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from sptrace.vocab.errors import TraceError

try:  # ISA-L inflates gzip about 2.5x faster than zlib (benchmarks/bench_load.py)
    from isal import igzip as _gzip
    from isal import isal_zlib as _zlib

    _CORRUPT: tuple[type[Exception], ...] = (zlib.error, _zlib.error, gzip.BadGzipFile, _zlib.IsalError)
except ImportError:  # pragma: no cover - isal is a dependency; gzip is the same API
    _gzip = gzip
    _CORRUPT = (zlib.error, gzip.BadGzipFile)

PIECE_BYTES = 4 << 20
"""The text read at a time (inflated, for gzip)."""


def carry_over(buffer: bytearray, view: memoryview, start: int, end: int) -> tuple[memoryview, int]:
    """``buffer[start:end]``, the text its reader has not used yet (less than an event, as a rule),
    moved to the buffer's front for the next piece to be read after it, and the buffer doubled
    when that is more than half of it (an event longer than a piece): (the buffer's view, anew
    where it grew; the bytes kept)."""
    kept = end - start
    if start:
        view[:kept] = bytes(view[start:end])
    if kept * 2 > len(buffer):
        view.release()
        buffer.extend(bytes(len(buffer)))
        view = memoryview(buffer)
    return view, kept


class TraceText:
    """The JSON text of a trace file, read into the caller's buffer (``read_into``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file: BinaryIO = open(path, "rb")
            head = self._file.read(2)
        except OSError as exc:
            raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
        if not head:
            self._file.close()
            raise TraceError(path, "empty file")
        self._file.seek(0)
        self._size = os.fstat(self._file.fileno()).st_size
        self.gzip = head == b"\x1f\x8b"
        self._text: BinaryIO = _gzip.GzipFile(fileobj=self._file, mode="rb") if self.gzip else self._file

    def read_into(self, view: memoryview) -> int:
        """Fill ``view`` with the next bytes of text as far as they go; 0 at the end."""
        with self._problems():
            return self._text.readinto(view)

    def share_read(self) -> float:
        """How much of the file is read, from 0 to 1 (of its compressed bytes, for gzip): what lets
        a reader foretell the whole from the part it has (the msgspec path: how many rows)."""
        return self._file.tell() / self._size if self._size else 1.0  # (no size told: as if all were read)

    def read_all(self) -> bytes:
        """The rest of the text, whole."""
        with self._problems():
            return self._text.read()

    @contextmanager
    def _problems(self) -> Iterator[None]:
        try:
            yield
        except gzip.BadGzipFile as exc:
            raise TraceError(self.path, f"corrupt gzip data ({exc})") from None
        except OSError as exc:
            raise TraceError(self.path, f"cannot read: {exc.strerror or exc}") from None
        except EOFError:
            raise TraceError(
                self.path, "truncated gzip stream: the file is incomplete (was it still being written?)"
            ) from None
        except _CORRUPT as exc:
            raise TraceError(self.path, f"corrupt gzip data ({exc})") from None

    def close(self) -> None:
        if self._text is not self._file:
            self._text.close()
        self._file.close()

    def __enter__(self) -> TraceText:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
