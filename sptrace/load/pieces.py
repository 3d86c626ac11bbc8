"""A trace file's JSON text in pieces, inflated as it is read: what lets the native decoder read a
rank without ever holding its text whole (sptrace/load/_kineto.c, ``Decoder.feed``).

The same checks as a whole read (``decode.read_bytes``): gzip by its magic number, not by the
file's name; an empty file, a truncated stream and corrupt data are each one TraceError naming the
file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

from sptrace.vocab.errors import TraceError

try:  # ISA-L inflates gzip about 2.5x faster than zlib (benchmarks/bench_load.py)
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the same API
    _zlib = zlib

READ_BYTES = 1 << 18
"""Bytes read from the file at a time (compressed, for gzip)."""
PIECE_BYTES = 4 << 20
"""At most this much inflated text in one piece."""


def text_pieces(path: Path, read_bytes: int = READ_BYTES, piece_bytes: int = PIECE_BYTES) -> Iterator[bytes]:
    """The file's JSON text, a piece of at most ``piece_bytes`` at a time (plain files: as read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(read_bytes)
            if not head:
                raise TraceError(path, "empty file")
            if head[:2] != b"\x1f\x8b":
                while head:
                    yield head
                    head = f.read(read_bytes)
                return
            yield from _inflated(path, f, head, read_bytes, piece_bytes)
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None


def _inflated(path: Path, f, head: bytes, read_bytes: int, piece_bytes: int) -> Iterator[bytes]:
    # wbits=47: a gzip or zlib header, detected; the stream must reach its end (else truncated)
    inflate = _zlib.decompressobj(wbits=47)
    data = head
    try:
        while data and not inflate.eof:
            while data and not inflate.eof:
                piece = inflate.decompress(data, piece_bytes)
                data = inflate.unconsumed_tail
                if piece:
                    yield piece
            data = f.read(read_bytes)
        if not inflate.eof and (rest := inflate.flush()):  # (output held back at the file's end)
            yield rest
    except (zlib.error, _zlib.error) as exc:
        raise TraceError(path, f"corrupt gzip data ({exc})") from None
    if not inflate.eof:
        raise TraceError(path, "truncated gzip stream: the file is incomplete (was it still being written?)")
