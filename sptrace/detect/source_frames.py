"""The source line that made each tensor kept across a boundary: sptrace.instrument's statement
lines (``sptrace.made::`` events, sptrace.makers), else the Python tracer's frames around the
allocation (the function's first line), else none (a trace recorded without stacks).

The maker is the innermost frame of the user's code, else the framework's
(sptrace.vocab.source_lines.maker)."""

from __future__ import annotations

import pandas as pd

from sptrace.detect.boundaries import Boundary
from sptrace.detect.columns import take_columns
from sptrace.detect.index import RankIndex
from sptrace.detect.intervals import Intervals
from sptrace.detect.ledger import Allocation
from sptrace.vocab import markers
from sptrace.vocab.source_lines import SourceLine, maker, parse_tracer_frame

SOURCE_COLUMNS = ["made_file", "made_line", "made_function", "made_exact"]
"""A retained tensor's maker (sptrace.detect.allocations.RETAINED_COLUMNS): file, line, function,
and whether the line is the statement's own (else the function's first)."""


class MakerLines:
    """Where one rank's tensors were made: by storage and forward (instrument's records), or by
    the allocation's time and thread (the Python tracer's frames)."""

    def __init__(self, idx: RankIndex) -> None:
        self._python: Intervals = idx.python
        made = take_columns(idx.events, idx.by_name.prefix(markers.MADE), ["name", "ts_ns"])
        self._records = sorted(
            (int(ts), markers.made_lines(str(name))) for name, ts in zip(made["name"], made["ts_ns"]) if pd.notna(ts)
        )  # (when the forward returned, storage -> line), in time order
        self._frames: dict[tuple[int, int], SourceLine | None] = {}

    @property
    def has_stacks(self) -> bool:
        """Does the trace show any source line (Python frames, or instrument's records)?"""
        return bool(len(self._python) or self._records)

    def of(self, ptr: int | None, alloc: Allocation | None, b: Boundary) -> SourceLine | None:
        """The maker of the storage at ``ptr`` (``alloc``: its allocation, where the ledger has it)
        kept across boundary ``b``."""
        forward_ns, boundary_ns = b.forward_ns, b.backward_ns
        if ptr:
            for ts, lines in self._records:
                if forward_ns <= ts <= boundary_ns and ptr in lines:
                    file, line, function = lines[ptr]
                    return SourceLine(file, line, function, exact=True)
        if alloc is None or not len(self._python):
            return None
        alloc_ns, tid = int(alloc.alloc_ns), alloc.tid
        thread = int(tid) if tid is not None and not pd.isna(tid) else None
        key = (int(alloc_ns), -1 if thread is None else thread)
        if key not in self._frames:
            idx = self._python.enclosing(int(alloc_ns), int(alloc_ns), thread)
            frames = (parse_tracer_frame(self._python.name(int(i))) for i in idx)
            self._frames[key] = maker(f for f in frames if f is not None)
        return self._frames[key]


def source_cells(line: SourceLine | None) -> dict[str, object]:
    """A retained row's SOURCE_COLUMNS."""
    if line is None:
        return dict.fromkeys(SOURCE_COLUMNS)
    return {"made_file": line.file, "made_line": line.line, "made_function": line.function, "made_exact": line.exact}


def source_of(row: object) -> SourceLine | None:
    """A row's maker back from its SOURCE_COLUMNS (None where it has none)."""
    file, line = getattr(row, "made_file", None), getattr(row, "made_line", None)
    if not isinstance(file, str) or line is None or line != line:
        return None
    return SourceLine(file, int(line), str(getattr(row, "made_function", "") or "?"),
                      bool(getattr(row, "made_exact", False)))  # fmt: skip


def source_texts(saved: pd.DataFrame) -> list[str | None]:
    """Each retained row's maker as text ('model.py:52 in forward()'), None where it has none."""
    if "made_file" not in saved:
        return [None] * len(saved)
    return [None if (line := source_of(row)) is None else line.text() for row in saved[SOURCE_COLUMNS].itertuples()]
