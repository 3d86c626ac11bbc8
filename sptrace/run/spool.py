"""Where the reduce keeps what it gathers from many ranks without holding it all.

``SpooledRanks`` holds one value per rank (a rank's work lane, its compute intervals, its
retained tensors) in memory up to ``SPILL_PAST_RANKS`` ranks, then moves every value into one
temporary file and reads each back only when asked: the critical path walks the lanes of the
few ranks on it, not all of them. The file is unlinked as soon as it is made, so it goes with
the last reference to its SpooledRanks or with the process, whatever ends either.

``FrameChunks`` gathers the ranks' small frames of one kind (collectives, phases, the lane per
step) as a few concatenated chunks with their strings shared, instead of one pandas frame (and
its few kilobytes of overhead) per rank.

Hand-written because neither job is a library's: Dask spills a cluster's task results, not a
driver's reduce, and pyarrow's IPC files need one schema where a rank's values are Python
objects (a Retention) or frames whose empty columns have no type.
"""

from __future__ import annotations

import io
import pickle
import tempfile
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")

SPILL_PAST_RANKS = 64
"""Values held in memory before the store moves to its file (a run of up to this many ranks
never touches the disk)."""
CHUNK_FRAMES = 256
"""Frames joined into one chunk (FrameChunks)."""


class SpooledRanks(Mapping[int, T], Generic[T]):
    """rank -> value, in memory while small, then in an unlinked temporary file (pickled)."""

    def __init__(self, spill_past: int | None = None) -> None:
        self.spill_past = SPILL_PAST_RANKS if spill_past is None else spill_past
        self._held: dict[int, T] = {}
        self._file: io.BufferedRandom | None = None
        self._where: dict[int, tuple[int, int]] = {}
        """rank -> (offset, length) in the file, once spilled."""
        self._at_end: int | None = 0
        """The file's length while its position is there (None after a read)."""

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def put(self, rank: int, value: T) -> None:
        if self._file is None:
            self._held[rank] = value
            if len(self._held) > self.spill_past:
                self._spill()
            return
        self._write(rank, value)

    def _spill(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="sptrace-spool-")  # unlinked at once (POSIX)
        held, self._held = self._held, {}
        for rank, value in held.items():
            self._write(rank, value)

    def _write(self, rank: int, value: T) -> None:
        assert self._file is not None
        blob = pickle.dumps(value, 5)
        if self._at_end is None:  # (a read moved the file's position: back to its end)
            self._at_end = self._file.seek(0, io.SEEK_END)
        self._file.write(blob)  # (no seek before each write: a seek flushes the write buffer)
        self._where[rank] = (self._at_end, len(blob))
        self._at_end += len(blob)

    def __getitem__(self, rank: int) -> T:
        if self._file is None:
            return self._held[rank]
        offset, length = self._where[rank]
        self._at_end = None
        self._file.seek(offset)
        return pickle.loads(self._file.read(length))

    def __iter__(self) -> Iterator[int]:
        return iter(self._where if self._file is not None else self._held)

    def __len__(self) -> int:
        return len(self._where) if self._file is not None else len(self._held)

    def __contains__(self, rank: object) -> bool:
        return rank in (self._where if self._file is not None else self._held)

    def __getstate__(self) -> dict[str, object]:  # pickled (a cached analysis): held, file and all
        return {"spill_past": self.spill_past, "_held": dict(self.items()), "_file": None, "_where": {}, "_at_end": 0}


class FrameChunks:
    """The ranks' frames of one kind, appended as they arrive and kept as a few chunks: a chunk is
    made of ``chunk_frames`` frames (CHUNK_FRAMES), its string columns categorical (each distinct string held
    once); ``frame()`` joins them with their columns' first dtypes back."""

    def __init__(self, columns: list[str], chunk_frames: int | None = None) -> None:
        self.columns, self.chunk_frames = columns, CHUNK_FRAMES if chunk_frames is None else chunk_frames
        self._pending: list[pd.DataFrame] = []
        self._chunks: list[pd.DataFrame] = []
        self._strings: set[str] = set()
        """Columns held as categories: object columns of strings and missing values."""

    def append(self, frame: pd.DataFrame | None) -> None:
        if frame is None or not len(frame):
            return
        self._pending.append(frame)
        if len(self._pending) >= self.chunk_frames:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        import pandas as pd

        chunk = _concat(self._pending)
        self._pending = []
        for name in chunk.columns:
            column = chunk[name]
            if column.dtype == object and pd.api.types.infer_dtype(column, skipna=True) in ("string", "empty"):
                chunk[name] = column.astype("category")
                self._strings.add(name)
        self._chunks.append(chunk)

    def frame(self) -> pd.DataFrame:
        """Every frame appended, in order, as one (columns ``columns`` when there was none)."""
        import pandas as pd

        if not self._chunks and len(self._pending) <= 1:
            return self._pending[0] if self._pending else pd.DataFrame(columns=self.columns)
        self._flush()
        return _concat([_as_objects(c, self._strings) for c in self._chunks])


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    import warnings

    import pandas as pd

    if len(frames) == 1:
        return frames[0]
    with warnings.catch_warnings():  # (a column all NA on one rank takes its type from the others: peers.py)
        warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation with empty or all-NA", FutureWarning)
        return pd.concat(frames, ignore_index=True)


def _as_objects(chunk: pd.DataFrame, strings: set[str]) -> pd.DataFrame:
    """A chunk's categorical string columns back as object columns of str and None."""
    import numpy as np

    out = chunk.copy(deep=False)
    for name in strings & set(chunk.columns):
        column = chunk[name]
        if str(column.dtype) != "category":
            continue
        codes = column.cat.codes.to_numpy()
        names = np.asarray([*column.cat.categories, None], dtype=object)  # code -1 (missing) -> None
        out[name] = names[codes]
    return out
