"""The critical path across ranks as the views read it: ``CriticalPath`` (its segments, each a
stretch of compute, transfer, wait or idle on one rank), its time by kind and by module, its
``Culprit`` (the rank and module that cost it the most), and each profiler step's path in short
(``StepPath``). The walk that finds it is sptrace.reduce.critical_walk."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.units import significant

SEGMENT_COLUMNS = ["rank", "kind", "module", "layer", "phase", "start_us", "dur_us", "collective", "waiting", "lane"]
"""One segment of the path. ``start_us`` is on the aligned clock (the reference rank's trace
clock, the clock sptrace.reduce.timebase.aligned gives), ``dur_us`` its length. ``kind``:
compute (the rank worked, in ``module``), transfer (a collective's data moved once its last
member arrived, or the last member was in the collective's call before; ``collective`` names it,
``rank`` is the member that arrived last), wait (the rank waited on a member the trace does not
hold), idle (the rank did nothing the trace records).
``waiting``: at a transfer, how many of the collective's other members had arrived earlier and
waited for ``rank``. ``lane``: where compute ran, gpu (kernels) or cpu (a thread)."""

SEQUENCE_COLUMNS = ["from start (ms)", "ms", "rank", "kind", "module", "layer", "phase", "collective", "waiting"]
"""CriticalPath.sequence's columns."""

KINDS = ("compute", "transfer", "wait", "idle")


@dataclass(frozen=True)
class Culprit:
    """The rank and module that cost the path the most wall time, and the collective where the
    rank then made others wait (None when the path reached no such collective after it)."""

    rank: int
    module: str | None
    phase: str | None
    dur_us: float
    collective: str | None
    waiting: int

    @property
    def where(self) -> str:
        """'rank 3 layers.7.attn backward'."""
        return f"rank {self.rank} {self.module or '(no module)'}" + (f" {self.phase}" if self.phase else "")

    def line(self, step_us: float) -> str:
        where = self.where
        share = f" of {significant(step_us / 1e3)} ms ({self.dur_us / step_us:.0%})" if step_us > 0 else ""
        text = f"critical path: {where}, {significant(self.dur_us / 1e3)} ms{share}"
        if self.collective and self.waiting:
            ranks = "rank" if self.waiting == 1 else "ranks"
            text += f", made {self.waiting} {ranks} wait at {self.collective}"
        return text

    def to_dict(self) -> JSONObject:
        return {
            "rank": self.rank, "module": self.module, "phase": self.phase, "dur_us": round(self.dur_us, 3),
            "collective": self.collective, "waiting": self.waiting,
        }  # fmt: skip


@dataclass(frozen=True)
class StepPath:
    """One profiler step's critical path in short."""

    step: str
    step_us: float
    by_kind: dict[str, float]
    culprit: Culprit | None

    def to_dict(self) -> JSONObject:
        return {
            "step": self.step, "step_us": round(self.step_us, 3),
            "summary": self.culprit.line(self.step_us) if self.culprit else None,
            "culprit": self.culprit.to_dict() if self.culprit else None,
            "by_kind_us": {k: round(v, 3) for k, v in self.by_kind.items()},
        }  # fmt: skip


@dataclass(frozen=True)
class CriticalPath:
    step_us: float
    start_us: float
    """The path's start on the aligned clock (``segments`` tile [start_us, start_us + step_us])."""
    segments: pd.DataFrame = field(repr=False)
    notes: tuple[str, ...] = ()
    step: str | None = None
    """The profiler step the path covers, when the ranks recorded several (the slowest of them)."""
    steps: tuple[StepPath, ...] = ()
    """Each step's path in short, when the ranks recorded several steps (in time order)."""

    def by_kind(self) -> dict[str, float]:
        """us of the path in each kind of segment (every kind, 0 where none)."""
        sums = self.segments.groupby("kind")["dur_us"].sum() if len(self.segments) else pd.Series(dtype=float)
        return {k: float(sums.get(k, 0.0)) for k in KINDS}

    def by_module(self, limit: int | None = None) -> pd.DataFrame:
        """us of the path per (module, phase, kind), longest first."""
        seg = self.segments.assign(module=self.segments["module"].fillna("(no module)"))
        seg = seg.assign(phase=seg["phase"].fillna(""))
        out = seg.groupby(["module", "phase", "kind"], sort=False)["dur_us"].sum().reset_index()
        out = out.sort_values("dur_us", ascending=False, kind="stable").reset_index(drop=True)
        return out.head(limit) if limit else out

    def headline(self) -> str:
        """The culprit's line (Culprit.line), else the path's length."""
        culprit = self.culprit
        if culprit is None:
            return f"critical path: {significant(self.step_us / 1e3)} ms"
        return culprit.line(self.step_us)

    def kinds_text(self, sep: str = ", ") -> str:
        """'compute 12.30 ms (41%), transfer ...': the path's time by kind."""
        step = max(self.step_us, 1e-9)
        return sep.join(f"{k} {v / 1e3:.2f} ms ({v / step:.0%})" for k, v in self.by_kind().items())

    def module_table(self, limit: int | None = None) -> pd.DataFrame:
        """by_module with the time in ms and its share of the path: what the views list."""
        rows = self.by_module(limit)
        rows = rows.assign(
            ms=(rows["dur_us"] / 1e3).round(3), share=(rows["dur_us"] / max(self.step_us, 1e-9)).round(3)
        )
        return rows[["module", "phase", "kind", "ms", "share"]]

    def sequence(self) -> pd.DataFrame:
        """The path in order, as the views list it: consecutive segments of one rank, kind, module,
        phase and collective joined, each from the path's start, in ms."""
        seg = self.segments
        if seg.empty:
            return pd.DataFrame(columns=SEQUENCE_COLUMNS)
        keys = ["rank", "kind", "module", "phase", "collective"]
        key = seg[keys].astype("string").fillna("").agg("|".join, axis=1)
        run = (key != key.shift()).cumsum()
        joined = seg.groupby(run, sort=False).agg(
            start_us=("start_us", "first"), dur_us=("dur_us", "sum"), rank=("rank", "first"), kind=("kind", "first"),
            module=("module", "first"), layer=("layer", "first"), phase=("phase", "first"),
            collective=("collective", "first"), waiting=("waiting", "max"),
        )  # fmt: skip
        out = pd.DataFrame({
            "from start (ms)": ((joined["start_us"] - self.start_us) / 1e3).round(3),
            "ms": (joined["dur_us"] / 1e3).round(3), "rank": joined["rank"].astype(int), "kind": joined["kind"],
            "module": joined["module"].astype(object).where(joined["module"].notna(), ""),
            "layer": pd.to_numeric(joined["layer"], errors="coerce").astype("Int64"),
            "phase": joined["phase"].astype(object).where(joined["phase"].notna(), ""),
            "collective": joined["collective"].astype(object).where(joined["collective"].notna(), ""),
            "waiting": joined["waiting"].astype(int),
        })  # fmt: skip
        return out.reset_index(drop=True)[SEQUENCE_COLUMNS]

    def step_table(self) -> pd.DataFrame:
        """One row per profiler step (none when the ranks recorded one): its path's length, the
        culprit and the time by kind, in ms: what the views list."""
        rows = [
            {"step": p.step, "ms": round(p.step_us / 1e3, 3), "culprit": p.culprit.where if p.culprit else "",
             "culprit ms": round(p.culprit.dur_us / 1e3, 3) if p.culprit else 0.0,
             **{f"{k} ms": round(v / 1e3, 3) for k, v in p.by_kind.items()}}
            for p in self.steps
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=["step", "ms", "culprit", "culprit ms", *(f"{k} ms" for k in KINDS)])

    @property
    def culprit(self) -> Culprit | None:
        """The (rank, module, phase) of compute that cost the most wall time on the path, and the
        collective right after its longest stretch where others waited for that rank."""
        seg = self.segments
        work = seg[seg["kind"] == "compute"]
        if work.empty:
            return None
        keyed = work.assign(module=work["module"].fillna(""), phase=work["phase"].fillna(""))
        sums = keyed.groupby(["rank", "module", "phase"], sort=False)["dur_us"].sum()
        (rank, module, phase), total = sums.idxmax(), float(sums.max())
        mine = keyed[(keyed["rank"] == rank) & (keyed["module"] == module) & (keyed["phase"] == phase)]
        longest = mine.loc[mine["dur_us"].idxmax(), "start_us"]
        after = seg[(seg["start_us"] >= longest) & (seg["kind"] == "transfer") & (seg["rank"] == rank)
                    & (seg["waiting"] > 0)]  # fmt: skip
        first = after.iloc[0] if len(after) else None
        return Culprit(
            rank=int(rank), module=module or None, phase=phase or None, dur_us=total,
            collective=None if first is None else str(first["collective"]),
            waiting=0 if first is None else int(first["waiting"]),
        )  # fmt: skip

    def to_dict(self) -> JSONObject:
        """The JSON ``critical_path`` object: segments from the path's start (us), summaries."""
        seg = self.segments
        culprit = self.culprit
        rows = [
            {
                "rank": int(r.rank), "kind": r.kind, "module": _none(r.module), "layer": _int(r.layer),
                "phase": _none(r.phase), "start_us": round(float(r.start_us) - self.start_us, 3),
                "dur_us": round(float(r.dur_us), 3), "collective": _none(r.collective), "waiting": int(r.waiting),
                "lane": _none(r.lane),
            }
            for r in seg.itertuples(index=False)
        ]  # fmt: skip
        modules = self.by_module()
        return {
            "step_us": round(self.step_us, 3),
            "summary": culprit.line(self.step_us) if culprit else None,
            "culprit": culprit.to_dict() if culprit else None,
            "by_kind_us": {k: round(v, 3) for k, v in self.by_kind().items()},
            "by_module_us": [
                {"module": m, "phase": p or None, "kind": k, "dur_us": round(float(d), 3)}
                for m, p, k, d in modules.itertuples(index=False)
            ],
            "segments": rows,
            "notes": list(self.notes),
            "step": self.step,
            "steps": [p.to_dict() for p in self.steps],
        }  # fmt: skip


def _none(value: object) -> object:
    return None if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA else value


def _int(value: object) -> int | None:
    value = _none(value)
    return None if value is None else int(value)  # type: ignore[call-overload]
