"""A trace's events decoded a chunk at a time as its text is read in pieces (sptrace.load.pieces): what
lets the msgspec path (sptrace.load.decode) hold one piece of text and its typed Structs at a time,
never the whole text beside every event decoded from it.

A JSON scanner in Python could not keep up with msgspec, so the chunks are cut by guessing and
checked by msgspec itself. One event can only end and the next begin at a ``}`` followed by ``,``
and ``{`` (whitespace between). Such a place lies between two events of the list, or inside a string,
or inside a list of objects nested in an event. Decoding ``[`` + the chunk + ``]`` tells them apart:
a chunk that begins at an event and decodes ends at one too, while a wrong cut leaves its string or
its event open at the end, and the decode fails there; then an earlier place is tried.

Whatever else (no top-level traceEvents list, a broken document, too many wrong cuts) raises
``Unstreamable``: the caller reads the text whole, which says what is wrong as it always did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from sptrace.load.pieces import PIECE_BYTES, TraceText, carry_over

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_KEY = b'"traceEvents"'
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_BYTE = re.compile(r"\(byte (\d+)\)")

TRIES = 3
"""Places tried, last first, in a piece before reading on (the next piece brings new ones)."""
WRONG_CUTS = 16
"""Wrong cuts allowed in a file before it is read whole (each costs a decode of its chunk)."""


class Unstreamable(Exception):
    """The text is not read in chunks here: the caller reads it whole, and says what is wrong."""


class EventChunks:
    """Iterating yields the events of a trace's ``traceEvents`` list, a chunk (a list) at a time in
    file order; each list is emptied once the next is asked for, so that its Structs, and the text
    their Raw fields point into, go as soon as the caller is done with them.

    After the iteration ``head`` holds the top-level object decoded from the text before the list
    (the list itself read as empty) and ``tail`` the one decoded from the list's last events and all
    that follows them: both with ``top``, the events with ``events``."""

    def __init__(
        self, path: Path, events: msgspec.json.Decoder, top: msgspec.json.Decoder, piece_bytes: int = PIECE_BYTES
    ) -> None:
        self.path = path
        self._events = events
        self._top = top
        self._piece_bytes = piece_bytes
        self.head: Any = None  # (a decoded ``top``)
        self.tail: Any = None
        self.wrong_cuts = 0
        self.share_read = 0.0  # of the file, by the pieces read so far (``TraceText.share_read``)

    def __iter__(self) -> Iterator[list[object]]:
        """One buffer takes every piece, as ``native.native_columns`` reads them: what follows the
        last chunk moves to its front, and the next piece is read after it (the buffer grows for a
        longer event, or while the head is read)."""
        buffer = bytearray(self._piece_bytes)
        view = memoryview(buffer)
        end = 0  # bytes of text in the buffer
        start: int | None = None  # where the next chunk begins, once the head is read
        listing = True  # until the list is found to end inside a chunk: the rest is the tail's
        try:
            with TraceText(self.path) as text:
                while got := text.read_into(view[end:]):
                    end += got
                    self.share_read = text.share_read()
                    if start is None:
                        start = self._read_head(buffer, end)
                    if start is not None and listing:
                        found = self._chunk(buffer, start, end)
                        if found is None:
                            listing = False
                        else:
                            start, events = found
                            if events:
                                yield events
                                events.clear()
                    view, end = carry_over(buffer, view, start or 0, end)
                    if start is not None:
                        start = 0
            if start is None:
                raise Unstreamable("no top-level traceEvents list")
            self.tail = self._read_tail(buffer, start, end)
        finally:
            view.release()

    def _read_head(self, buffer: bytearray, end: int) -> int | None:
        """Where the list's text begins (just after its ``[``), once the buffer holds it, and
        ``head`` decoded. The key must be the object's own, written once: text that is no object,
        or an earlier "traceEvents" anywhere, and the whole text is read instead."""
        found = _EVENTS_KEY.search(buffer, 0, end)
        if found is None:
            return None
        if buffer.find(_KEY, 0, found.start()) >= 0:
            raise Unstreamable("traceEvents written twice, or inside a value")
        try:
            self.head = self._top.decode(buffer[: found.start()] + b'"traceEvents": []}')
        except msgspec.DecodeError as exc:  # (ValidationError too: not a Kineto top-level object)
            raise Unstreamable("the text before traceEvents is no object's beginning") from exc
        return found.end()

    def _chunk(self, buffer: bytearray, start: int, end: int) -> tuple[int, list[object]] | None:
        """The events decoded from ``buffer[start:end]`` up to the last place, of the ``TRIES`` last,
        where one ends, with where the next begins; (start, []) when none decodes yet; None when the
        list ends inside the text (all of the rest is the tail's)."""
        limit = end
        for _ in range(TRIES):
            place = _last_boundary(buffer, start, limit)
            if place is None:
                break
            cut, following = place
            text = b"".join((b"[", memoryview(buffer)[start:cut], b"]"))
            try:
                return following, self._events.decode(text)
            except msgspec.ValidationError:
                raise  # an event of unexpected types (never a wrong cut): the caller's tolerant path
            except msgspec.DecodeError as exc:
                problem = str(exc)
                if "trailing characters" in problem:
                    return None  # the list closed before the cut
                if not _left_open(problem, len(text)):
                    raise Unstreamable("invalid JSON") from exc
            self.wrong_cuts += 1
            if self.wrong_cuts > WRONG_CUTS:
                raise Unstreamable("too many wrong cuts")
            limit = cut - 1
        return start, []

    def _read_tail(self, buffer: bytearray, start: int, end: int) -> msgspec.Struct:
        """The top-level object of the list's last events and what follows them (``buffer[start:end]``).
        Another "traceEvents" in that text (a repeated key) and the whole text is read instead."""
        if buffer.find(_KEY, start, end) >= 0:
            raise Unstreamable("traceEvents written twice")
        try:
            return self._top.decode(b"".join((b'{"traceEvents": [', memoryview(buffer)[start:end])))
        except msgspec.ValidationError:
            raise
        except msgspec.DecodeError as exc:
            raise Unstreamable("invalid JSON") from exc


def _last_boundary(buffer: bytearray, start: int, end: int) -> tuple[int, int] | None:
    """The last place in ``buffer[start:end]`` where an event may end and the next begin: (just
    after its ``}``, at the next ``{``)."""
    close = end
    while (close := buffer.rfind(b"}", start, close)) >= 0:
        if following := _BOUNDARY.match(buffer, close, end):
            return close + 1, following.end() - 1
    return None


def _left_open(problem: str, size: int) -> bool:
    """Whether msgspec's complaint about a chunk is its end: the text ran out, or the closing
    ``]`` (at ``size - 1``) came where the event or a string was still open."""
    at = _BYTE.search(problem)
    return "truncated" in problem or (at is not None and int(at.group(1)) >= size - 1)
