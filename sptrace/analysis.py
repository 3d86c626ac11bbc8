"""Every analysis of one run, built in one place: ``analyse_run`` -> ``RunAnalysis``.

``sptrace check``, ``analyze``, ``report``, ``dash``, ``demo`` and ``sweep`` all render this one
typed result, so they can never disagree: load -> collectives -> matching and timing -> the
cost model check -> retained tensors -> the sharding check. What the run does not declare is
unknown (sptrace.shape.ModelShape); an analysis that needs it is left out with the reason,
naming the flag to pass, instead of running on a guess.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from sptrace import markers
from sptrace.checks.comm import CommReport, check_collectives
from sptrace.checks.crossrank import CrossRankReport, check_cross_rank
from sptrace.checks.findings import Finding, Verdict
from sptrace.checks.sharding import NEEDS as SHARDING_NEEDS
from sptrace.checks.sharding import ShardingReport, check_sharding
from sptrace.costmodel import CommEstimate, activation_bytes_per_layer, estimate_comm
from sptrace.costmodel.comm import NEEDS as COMM_NEEDS
from sptrace.detect.allocations import Retention, detect_retained
from sptrace.detect.collectives import COLUMNS, RankIndex, detect_collectives, fill_from_peers
from sptrace.detect.matching import Matching, match_collectives
from sptrace.detect.timing import RankTiming, detect_compute, detect_timing
from sptrace.errors import SptraceError, UsageError
from sptrace.load.trace import RunTrace, load_run
from sptrace.shape import ModelShape

PARTS = ("collectives", "sharding")
COMPUTE_COLUMNS = ["rank", "start_us", "dur_us"]
"""What analyse_run can compute: collectives (with matching, timing and the cost-model check) and
the sharding check."""


@dataclass(frozen=True)
class RunAnalysis:
    """One run, analysed. ``comm`` / ``sharding`` are None when the run does not declare what
    they need; ``comm_unavailable`` / ``sharding_unavailable`` then say what to pass."""

    path: Path | None
    run: RunTrace
    model: ModelShape
    warnings: tuple[str, ...]
    collectives: pd.DataFrame
    matching: Matching | None
    timing: tuple[RankTiming, ...]
    estimate: CommEstimate | None
    comm: CommReport | None
    comm_unavailable: str | None
    retained: tuple[Retention, ...]
    sharding: ShardingReport | None
    sharding_unavailable: str | None
    expected_activation_bytes: float | None
    """Korthikanti's activations per layer and rank for the declared scheme (bytes)."""
    phases: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    memory: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    compute: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    """When each rank computed (GPU compute kernels, else its busiest thread's CPU ops), merged."""
    crossrank: CrossRankReport | None = None
    """Whether the ranks agree with each other (needs no model of the job): always computed with
    the collectives; ``analyze`` renders it when the cost-model comparison cannot run."""

    def step_start_us(self, rank: int) -> float:
        """Where a rank's step starts: its first phase (ProfilerStep or sptrace.phase), else its
        first collective: the zero of "ms from the step start"."""
        p = self.phases[self.phases["rank"] == rank] if len(self.phases) else self.phases
        if len(p):
            return float(p["start_us"].min())
        c = self.collectives[self.collectives["rank"] == rank] if len(self.collectives) else self.collectives
        return float(c["start_us"].min()) if len(c) else 0.0

    @property
    def offsets_us(self) -> dict[int, float]:
        """Each rank's clock offset (matching's estimate): subtract it to align ranks' clocks."""
        return dict(self.matching.offsets_us) if self.matching is not None else {}

    @cached_property
    def step_zero_us(self) -> float:
        """The earliest rank's step start, on the aligned clock: 0 ms in every view."""
        offsets = self.offsets_us
        starts: dict[int, float] = {}
        if len(self.collectives):  # a rank without phases starts at its first collective
            starts.update(self.collectives.groupby("rank")["start_us"].min().items())
        if len(self.phases):
            starts.update(self.phases.groupby("rank")["start_us"].min().items())
        aligned = [float(s) - offsets.get(int(r), 0.0) for r, s in starts.items()]
        return min(aligned) if aligned else 0.0

    def clock_ms(self, rank: Any, us: Any) -> Any:
        """Milliseconds from the step start on clocks aligned across ranks, for a rank and a
        trace timestamp in us (scalars, or pandas Series of equal length)."""
        offsets = self.offsets_us
        if isinstance(rank, pd.Series):
            shift = rank.map(lambda r: offsets.get(int(r), 0.0) if pd.notna(r) else 0.0).astype(float)
            return (pd.to_numeric(us, errors="coerce").astype(float) - shift - self.step_zero_us) / 1e3
        return (float(us) - offsets.get(int(rank), 0.0) - self.step_zero_us) / 1e3

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else "run"

    def findings(self) -> list[Finding]:
        """Every check's findings; the cross-rank ones when there was no cost model to check against."""
        comm = self.comm.findings if self.comm else (self.crossrank.findings if self.crossrank else [])
        return [*comm, *(self.sharding.findings if self.sharding else [])]

    @property
    def collectives_verdict(self) -> Verdict | None:
        """The collectives' verdict: against the cost model, else the ranks against each other."""
        if self.comm is not None:
            return self.comm.verdict
        return self.crossrank.verdict if self.crossrank is not None else None

    def wire_bytes_per_rank(self) -> float:
        """Bytes on the wire in the step, mean over the ranks with collectives (those whose size
        or group the trace does not record count nothing)."""
        frame = self.collectives
        if frame.empty:
            return 0.0
        return float(frame["wire_bytes"].dropna().sum()) / max(frame["rank"].nunique(), 1)

    def retained_per_layer(self) -> float | None:
        """Bytes kept across the forward/backward boundary per layer and rank (mean over the
        sharding check's layers); None when the check did not run or judged no layer."""
        layers = self.sharding.layers if self.sharding is not None else None
        return float(layers["measured_bytes"].mean()) if layers is not None and len(layers) else None

    def time_summary(self) -> dict[str, float | None]:
        """Over ranks: the slowest step, mean transfer time, mean exposed communication."""
        steps = [float(t.step_ms) for t in self.timing if t.step_ms is not None]
        exposed = [float(t.exposed_ms) for t in self.timing if t.exposed_ms is not None]
        comm = [float(t.comm_ms) for t in self.timing]
        return {
            "step_ms": max(steps) if steps else None,
            "comm_ms": sum(comm) / len(comm) if comm else None,
            "exposed_ms": sum(exposed) / len(exposed) if exposed else None,
            "comm_share": (sum(comm) / len(comm)) / max(steps) if comm and steps and max(steps) > 0 else None,
        }


def resolve_model(run: RunTrace, flags: Mapping[str, Any] | None = None) -> ModelShape:
    """run.json's declared config, overridden by flags; P and L read off the trace when it leaves
    one answer (the run's only process group; the layers that ran), saying so in provenance."""
    declared = (run.run_info or {}).get("config") if isinstance(run.run_info, dict) else None
    model = ModelShape.from_mapping(declared if isinstance(declared, dict) else None, "run.json")
    if flags:
        model = model.override("flags", **dict(flags))
    if model.sp_size is None:
        groups = {(g.get("pg_name"), g.get("pg_size")) for t in run for g in t.process_groups if isinstance(g, dict)}
        if len(groups) == 1:
            ((_, size),) = groups
            if isinstance(size, int) and size > 0:
                model = model.override(f"the run's only process group ({size} ranks)", sp_size=size)
    return model


def analyse_run(
    source: Path | str | RunTrace,
    *,
    flags: Mapping[str, Any] | None = None,
    allow: tuple[str, ...] = (),
    strict: bool = False,
    k: int = 2,
    parts: tuple[str, ...] = PARTS,
    load_options: Mapping[str, Any] | None = None,
) -> RunAnalysis:
    """Analyse one run (a folder, a trace file, or a loaded RunTrace). ``flags``: ModelShape
    fields the user passed; ``parts``: which of collectives / sharding to compute."""
    if isinstance(source, RunTrace):
        run, path = source, source.root
        seen = list(run.warnings)
    else:
        path = Path(source)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = load_run(path, **dict(load_options or {}))
        seen = [str(w.message) for w in caught]
    model = resolve_model(run, flags)
    indexes = {t.rank: RankIndex(t) for t in run}
    frames = []
    timing = []
    compute = []
    if "collectives" in parts:
        for trace in run:
            frame = detect_collectives(trace, indexes[trace.rank])
            frames.append(frame)
            timing.append(detect_timing(trace, frame, indexes[trace.rank]))
            compute.append(detect_compute(trace, indexes[trace.rank]))
    frames = [f for f in frames if not f.empty]
    collectives = fill_from_peers(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame(columns=COLUMNS)
    if model.layers is None:
        layers = set(collectives["layer"].dropna().astype(int)) if len(collectives) else set()
        if layers:
            model = model.override(
                f"the trace (layers {min(layers)}-{max(layers)} communicate)", layers=max(layers) + 1
            )
    matching = match_collectives(collectives) if "collectives" in parts else None
    estimate = comm = None
    comm_unavailable = None
    if "collectives" in parts:
        comm_unavailable = model.why_missing(COMM_NEEDS, "checking collectives against the cost model")
        if comm_unavailable is None:
            try:
                estimate = estimate_comm(model, k=k)
            except (UsageError, ValueError) as exc:
                comm_unavailable = str(exc)
        if estimate is not None:
            comm = check_collectives(collectives, estimate, sorted(run.ranks), matching)
            if run.missing_ranks:
                comm.notes.append(
                    f"ranks without a trace: {len(run.missing_ranks)} of {run.world_size}; analysed the rest"
                )
    crossrank = None
    if "collectives" in parts:
        crossrank = check_cross_rank(collectives, matching, sorted(run.ranks), comm_unavailable)
        if run.missing_ranks:
            crossrank.notes.append(f"ranks without a trace: {len(run.missing_ranks)} of {run.world_size}")
    expected_act = activation_bytes_per_layer(model)
    if expected_act is not None and model.dtype_bytes:
        expected_act = expected_act * model.dtype_bytes / 2  # Korthikanti counts 2-byte activations
    retained: tuple[Retention, ...] = ()
    sharding = None
    sharding_unavailable = None
    if "sharding" in parts:
        sharding_unavailable = model.why_missing(SHARDING_NEEDS, "the sharding check")
        if sharding_unavailable is None and model.seq % model.sp_size:
            sharding_unavailable = f"seq {model.seq} is not divisible by the sequence-parallel size {model.sp_size}"
        if sharding_unavailable is None:
            retained = tuple(detect_retained(t, element_size=model.dtype_bytes, index=indexes[t.rank]) for t in run)
            sharding = check_sharding(
                list(retained), model, allow=allow, strict=strict, expected_per_layer=expected_act
            )
            if run.missing_ranks:
                sharding.notes.append(f"ranks without a trace, not checked: {run.missing_ranks}")
    return RunAnalysis(
        path=path, run=run, model=model, warnings=tuple(seen), collectives=collectives, matching=matching,
        timing=tuple(timing), estimate=estimate, comm=comm, comm_unavailable=comm_unavailable, retained=retained,
        sharding=sharding, sharding_unavailable=sharding_unavailable, expected_activation_bytes=expected_act,
        phases=_phases(run), memory=_memory_series(run),
        compute=pd.concat(compute, ignore_index=True) if compute else pd.DataFrame(columns=COMPUTE_COLUMNS),
        crossrank=crossrank,
    )  # fmt: skip


def try_analyse(source: Path | str, **options: Any) -> RunAnalysis | SptraceError:
    """analyse_run, or the error that made the run unusable (for views over many runs)."""
    try:
        return analyse_run(source, **options)
    except SptraceError as exc:
        return exc


def _phases(run: RunTrace) -> pd.DataFrame:
    """Each rank's phase ranges (sptrace.phase markers, else its ProfilerStep), in us."""
    rows = []
    for trace in run:
        ev = trace.events
        names = ev["name"].astype(str)
        marked = ev[names.str.startswith(markers.PHASE) & (ev["ph"].astype(str) == "X")]
        if marked.empty:
            marked = ev[names.str.startswith("ProfilerStep#")]
        for name, ts, dur in zip(marked["name"].astype(str), marked["ts_ns"], marked["dur_ns"].fillna(0)):
            phase = name[len(markers.PHASE) :] if name.startswith(markers.PHASE) else "step"
            rows.append({"rank": trace.rank, "phase": phase, "start_us": ts / 1e3, "dur_us": dur / 1e3})
    return pd.DataFrame(rows, columns=["rank", "phase", "start_us", "dur_us"])


def _memory_series(run: RunTrace, max_points: int = 1500) -> pd.DataFrame:
    """Allocated bytes over the step per rank, from [memory] events' Total Allocated (at most
    ``max_points`` per rank: the page needs the shape, not every event)."""
    frames = []
    for trace in run:
        ev = trace.events
        mem = ev[(ev["name"].astype(str) == "[memory]") & ev["mem_total_allocated"].notna()]
        if mem.empty:
            continue
        mem = mem.sort_values("ts_ns", kind="stable")
        step = max(len(mem) // max_points, 1)
        part = mem.iloc[::step]
        frames.append(pd.DataFrame({
            "rank": trace.rank, "ts_us": part["ts_ns"].astype("int64") / 1e3,
            "allocated_bytes": part["mem_total_allocated"].astype("int64"),
        }))  # fmt: skip
    return (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["rank", "ts_us", "allocated_bytes"])
    )
