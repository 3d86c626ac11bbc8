"""The findings of the sharding verdict: one per rank and kept full-size tensor (or, --strict,
unjudged one), however often it repeats (each step, each micro-batch: the boundaries it was kept
at, in short in its message and in full in its JSON), then merged across ranks."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import NamedTuple

import pandas as pd

from sptrace.checks.findings import Finding, merge_ranks
from sptrace.checks.sharding import Judge
from sptrace.detect.source_frames import source_of
from sptrace.vocab.units import human_bytes, rank_ranges


def kept_findings(saved: pd.DataFrame, judge: Judge, allow: tuple[str, ...], strict: bool, *,
                  stacks: bool) -> list[Finding]:  # fmt: skip
    """The findings of the judged rows ``saved`` (sharding_verdict's columns): a full-size tensor
    the step keeps outside ``allow``, or with ``strict`` one whose class is unknown; ``stacks``:
    the trace shows source lines (else each finding says how to record them)."""
    kept = saved[saved["decides"] != "settled"].rename(columns={"class": "cls"})[list(_Saved._fields)]
    repeats: dict[_Saved, list[tuple[int | None, int]]] = {}  # a rank's stray -> where it repeats
    for rec in map(_Saved._make, kept.itertuples(index=False, name=None)):
        if rec.cls != "full" and not (strict and rec.decides == "unjudged"):
            continue
        if rec.decides == "undecided-holder":
            continue
        module = rec.module or "<unknown module>"
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in allow):
            continue
        where = (None if rec.step != rec.step or rec.step is None else int(rec.step), int(rec.micro_batch or 0))
        same = rec._replace(boundary=_many(rec.boundary), step=None, micro_batch=None)
        repeats.setdefault(same, []).append(where)
    return merge_ranks(_finding(rec, judge, stacks, tuple(sorted(set(w), key=_order))) for rec, w in repeats.items())


class _Saved(NamedTuple):
    """The columns of a retained tensor's row (RETAINED_COLUMNS, its class, why and what it
    decides) that its finding reads."""

    rank: int
    layer: float | None
    """NaN where the tensor is in no layer"""
    module: str | None
    shape: tuple[int, ...] | list[int] | None
    nbytes: int
    storage_bytes: int
    cls: str
    why: str
    holder: str | None
    evidence: str | None
    alloc_op: str | None
    dtype: str | None
    boundary: str | None
    """Its boundary's label; in a finding, which of step and micro-batch the labels name."""
    step: float | None
    micro_batch: float | None
    decides: str
    freed_in: str | None
    saved_by: str | None
    made_file: str | None
    made_line: float | None
    made_function: str | None
    made_exact: bool | None


def _finding(rec: _Saved, judge: Judge, stacks: bool, boundaries: tuple[tuple[int | None, int], ...]) -> Finding:
    """One rank's full-size (or, --strict, unjudged) tensor, kept at each of ``boundaries`` (step,
    micro-batch): one finding however often it repeats."""
    module = rec.module or "<unknown module>"
    node = rec.freed_in if isinstance(rec.freed_in, str) else rec.saved_by if isinstance(rec.saved_by, str) else None
    origin_fields = {
        "source": source_of(rec),
        "saver": f"{module} ({node})" if node else module,
        "no_source": None if stacks else NO_SOURCE,
    }
    shape = "x".join(map(str, rec.shape)) if isinstance(rec.shape, (tuple, list)) else f"{rec.nbytes} bytes"
    layer = int(rec.layer) if rec.layer is not None and rec.layer == rec.layer else None
    where = boundaries_text(boundaries, rec.boundary or "")
    where = f" of {where}" if where else ""
    held = f"{held_text(rec.holder)}: {rec.evidence}" if rec.holder else ""
    if rec.cls != "full":
        return Finding(
            "error", "sharding", f"{rec.cls}-tensor",
            f"{module} keeps a [{shape}] tensor across the forward/backward boundary{where} that cannot be judged "
            f"(--strict; {held}): {rec.why}",
            (int(rec.rank),), layer, module, page="memory", holder=rec.holder, evidence=rec.evidence, **origin_fields,
            boundaries=boundaries if where else (),
        )  # fmt: skip
    storage = int(rec.storage_bytes)
    excess = storage - storage / judge.model.sp_size
    origin = [held] if held else []
    if rec.alloc_op:
        origin.append(f"allocated by {rec.alloc_op}")
    dtype = f"{rec.dtype} " if rec.dtype else ""
    return Finding(
        "error", "sharding", "full-size-save",
        f"{module} keeps a full-sequence [{shape}] {dtype}tensor across the forward/backward boundary{where} "
        f"({human_bytes(storage)}, {human_bytes(excess)} more than a 1/{judge.model.sp_size} shard"
        + (f"; {'; '.join(origin)}" if origin else "") + f"): {rec.why}",
        (int(rec.rank),), layer, module, page="memory", holder=rec.holder, evidence=rec.evidence, **origin_fields,
        boundaries=boundaries if where else (),
    )  # fmt: skip


NO_SOURCE = ("no source line: the trace has no Python stacks; profile with with_stack=True (sptrace.profile_step's "
             "default), or run the model under sptrace.instrument")  # fmt: skip


def held_text(holder: str) -> str:
    """'held by autograd', 'offloaded' (a pack hook's copy kept in the saved tensor's place)."""
    return "offloaded" if holder == "offloaded" else f"held by {holder}"


def _many(label: object) -> str:
    """Which of step and micro-batch a boundary's label names ('step', 'micro-batch', both or '')."""
    text = label if isinstance(label, str) else ""
    return " ".join(w for w in ("step", "micro-batch") if w in text)


def _order(where: tuple[int | None, int]) -> tuple[int, int]:
    return (-1 if where[0] is None else where[0], where[1])


def boundaries_text(boundaries: Sequence[tuple[int | None, int]], names: str) -> str:
    """Where a finding repeats, as its boundaries' labels say it (``names``: _many's): 'step 3',
    'steps 1-862', 'micro-batches 0-3', 'steps 1-2, micro-batches 0-1' (every micro-batch of
    each step), else the first three and how many more; '' where the run has one boundary."""
    steps = sorted({s for s, _ in boundaries if s is not None})
    micros = sorted({m for _, m in boundaries})
    parts = []
    if "step" in names and steps:
        parts.append(("step " if len(steps) == 1 else "steps ") + rank_ranges(steps))
    if "micro-batch" in names:
        parts.append(("micro-batch " if len(micros) == 1 else "micro-batches ") + rank_ranges(micros))
    if "step" in names and "micro-batch" in names and len(boundaries) != len(steps) * len(micros):
        shown = [f"step {s}, micro-batch {m}" for s, m in boundaries[:3]]
        more = len(boundaries) - len(shown)
        return "; ".join(shown) + (f" and {more} more" if more else "")
    return ", ".join(parts)
