"""Every analysis of one run, built in one place: ``analyse_run`` -> ``RunAnalysis``.

``sptrace check``, ``analyze``, ``report``, ``dash``, ``demo`` and ``sweep`` all render this one
typed result, so they can never disagree: load -> collectives -> matching and timing -> the
cost model check -> retained tensors -> the sharding check. What the run does not declare is
unknown (sptrace.vocab.shape.ModelShape); an analysis that needs it is left out with the reason,
naming the flag to pass, instead of running on a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import pandas as pd

from sptrace.checks.builtin import CollectivesDetail
from sptrace.checks.comm import CommReport
from sptrace.checks.crossrank import CrossRankReport
from sptrace.checks.findings import Finding, Verdict
from sptrace.checks.production import production_declared, production_shape
from sptrace.checks.projection import Projection, project
from sptrace.checks.registry import COLLECTIVES, SHARDING, CheckFacts, CheckOptions, CheckReport, run_checks
from sptrace.checks.sharding_verdict import ShardingReport
from sptrace.costmodel import CommEstimate
from sptrace.costmodel.activations import activation_bytes_at_dtype
from sptrace.costmodel.sweep import ModelSweep, sweep_model
from sptrace.detect.allocations import Retention
from sptrace.detect.timing import RankTiming, step_sources
from sptrace.load.files import RunFiles
from sptrace.load.trace import RunTrace
from sptrace.reduce.balance import Balance, compute_balance
from sptrace.reduce.critical import CriticalPath
from sptrace.reduce.critical_walk import module_layers, run_critical_path
from sptrace.reduce.matching import Matching, match_collectives
from sptrace.reduce.p2p import P2PReport, analyse_point_to_point
from sptrace.reduce.peers import merge_collectives
from sptrace.reduce.replay_graph import ReplayGraph, replay_graphs
from sptrace.resolve import declared_model, require_memory_events, require_sharding_shape, resolve_model
from sptrace.run import LoadOptions
from sptrace.run.gather import COMPUTE_COLUMNS, GatheredRanks, gather_results, joined
from sptrace.run.map import MapSpec, RankResult, gather_run, summarize
from sptrace.run.options import LoadOptionValues
from sptrace.vocab.errors import SptraceError
from sptrace.vocab.shape import Declarations, ModelShape, ShapeValues

if TYPE_CHECKING:
    from typing_extensions import Unpack

PARTS = ("collectives", "sharding", "path")
"""What analyse_run computes by default: collectives (with matching, timing and the cost-model
check), the sharding check and the critical path across ranks (``path``, with ``collectives``);
``modules`` (each module's own time, for sptrace diff) and ``whatif`` (the replay graphs, with
``collectives``) on request."""


@dataclass(frozen=True)
class RunFacts:
    """A run's headline numbers, over its ranks (None where the run cannot tell): what the
    dashboard's Overview and Compare pages, the HTML report and a sweep's table show. The slowest
    rank's step (``step_source`` says what measured it: sptrace.detect.timing.step_window), then
    the mean over ranks of transfer time and of communication no compute kernel overlaps (None
    without GPU streams), in ms; bytes on the wire per rank, measured and the cost model's; bytes
    kept across the forward/backward boundary per layer and rank (the sharding check's mean); the
    largest allocated memory a [memory] event recorded (0 without any)."""

    step_ms: float | None
    comm_ms: float | None
    exposed_ms: float | None
    comm_share: float | None
    step_source: str | None
    wire_bytes: float
    model_wire_bytes: float | None
    retained_per_layer: float | None
    peak_allocated: int


@dataclass(frozen=True)
class RunAnalysis:
    """One run, analysed: its cross-rank facts, its model (resolved once) and every check's report
    (``reports``). The run's own checks' typed reports read as attributes: ``comm`` / ``sharding``
    are None when the run does not declare what they need; ``comm_unavailable`` /
    ``sharding_unavailable`` then say what to pass."""

    path: Path | None
    run: RunTrace
    model: ModelShape
    warnings: tuple[str, ...]
    collectives: pd.DataFrame
    matching: Matching | None
    timing: tuple[RankTiming, ...]
    retained: Sequence[Retention] = ()
    phases: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    memory: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    compute_lanes: Mapping[int, pd.DataFrame] = field(repr=False, default_factory=dict)
    """rank -> when it computed (COMPUTE_COLUMNS: GPU compute kernels, else its busiest thread's
    CPU ops); held on disk past a few dozen ranks (sptrace.run.spool), read when asked."""
    peak_allocated: dict[int, int] = field(default_factory=dict)
    """Per rank, the largest allocated memory a [memory] event recorded (bytes)."""
    p2p: P2PReport | None = None
    """Sends paired with receives, ring steps, overlap and balance (None without point-to-point)."""
    module_times: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    """Each rank's own time per module, forward and backward (MODULE_TIME_COLUMNS, ms)."""
    critical_path: CriticalPath | None = None
    """The chain of work, transfers and waiting across ranks that set the step time."""
    balance: Balance | None = None
    """The ranks' compute per layer and phase against the work the model gives each, and the causes
    of an imbalance (sptrace.reduce.balance; with the critical path)."""
    replay_graphs: tuple[ReplayGraph, ...] = field(repr=False, default=())
    """Each profiled step's cross-rank dependency graph (with the ``whatif`` part): what
    sptrace.whatif replays with changed costs."""
    reports: Mapping[str, CheckReport] = field(default_factory=dict)
    """Every check's report by name, the run's own (COLLECTIVES, SHARDING, where computed) first,
    then the registered checks' (sptrace.checks.registry): what the views render generically."""
    production: tuple[tuple[str, ShapeValues], ...] = ()
    """The production shape to project the kept bytes to, as declared (run.json's production block,
    a --config file's, --at; a later one wins): empty when none is (sptrace.checks.projection)."""

    @cached_property
    def compute(self) -> pd.DataFrame:
        """Every rank's compute intervals (``compute_lanes``), merged in rank order."""
        return joined(self.compute_lanes, COMPUTE_COLUMNS)

    # ---- the run's own checks' typed reports ------------------------------------------------
    @property
    def _collectives_detail(self) -> CollectivesDetail | None:
        report = self.reports.get(COLLECTIVES)
        return report.detail if report is not None and isinstance(report.detail, CollectivesDetail) else None

    @property
    def estimate(self) -> CommEstimate | None:
        """The cost model's collectives for the declared model (None when it leaves a size undeclared)."""
        return self._collectives_detail.estimate if self._collectives_detail else None

    @property
    def comm(self) -> CommReport | None:
        """The collectives against the cost model (None with ``comm_unavailable``)."""
        return self._collectives_detail.comm if self._collectives_detail else None

    @property
    def comm_unavailable(self) -> str | None:
        return self._collectives_detail.unavailable if self._collectives_detail else None

    @property
    def crossrank(self) -> CrossRankReport | None:
        """Whether the ranks agree with each other (needs no model of the job): always computed with
        the collectives; ``analyze`` renders it when the cost-model comparison cannot run."""
        return self._collectives_detail.crossrank if self._collectives_detail else None

    @property
    def sharding(self) -> ShardingReport | None:
        report = self.reports.get(SHARDING)
        return report.detail if report is not None and isinstance(report.detail, ShardingReport) else None

    @cached_property
    def projection(self) -> Projection | None:
        """The kept bytes per rank and each FAIL's extra bytes at the production shape (None when
        no production shape is declared or the sharding check did not run)."""
        report = self.sharding
        if not self.production or report is None:
            return None
        return project(report, production_shape(self.model, self.production))

    @property
    def sharding_unavailable(self) -> str | None:
        report = self.reports.get(SHARDING)
        return report.unavailable if report is not None else None

    @property
    def expected_activation_bytes(self) -> float | None:
        """Korthikanti's activations per layer and rank for the declared scheme (bytes)."""
        return activation_bytes_at_dtype(self.model)

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

    def clock_ms(self, rank: int | pd.Series, us: float | pd.Series) -> float | pd.Series:
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
        """Every check's findings (the registered ones' last); the cross-rank ones when there was no
        cost model to check against."""
        comm = self.comm.findings if self.comm else (self.crossrank.findings if self.crossrank else [])
        others = [f for name, r in self.reports.items() if name not in (COLLECTIVES, SHARDING) for f in r.findings]
        return [*comm, *(self.sharding.findings if self.sharding else []), *others]

    @property
    def collectives_verdict(self) -> Verdict | None:
        """The collectives' verdict: against the cost model, else the ranks against each other."""
        if self.comm is not None:
            return self.comm.verdict
        return self.crossrank.verdict if self.crossrank is not None else None

    @cached_property
    def facts(self) -> RunFacts:
        """The run's headline numbers (RunFacts), over its ranks (wire bytes per rank and step)."""
        step_times = [float(t.step_ms) for t in self.timing if t.step_ms is not None]
        exposed = [float(t.exposed_ms) for t in self.timing if t.exposed_ms is not None]
        comm = [float(t.comm_ms) for t in self.timing]
        frame = self.collectives  # a collective whose size or group the trace does not record counts nothing
        steps = max(int(frame["step"].nunique()), 1) if not frame.empty and "step" in frame else 1
        wire = (
            0.0 if frame.empty else float(frame["wire_bytes"].dropna().sum()) / max(frame["rank"].nunique(), 1) / steps
        )
        layers = self.sharding.layers if self.sharding is not None else None
        return RunFacts(
            step_ms=max(step_times) if step_times else None,
            comm_ms=sum(comm) / len(comm) if comm else None,
            exposed_ms=sum(exposed) / len(exposed) if exposed else None,
            comm_share=(sum(comm) / len(comm)) / max(step_times)
            if comm and step_times and max(step_times) > 0
            else None,
            step_source=step_sources(self.timing),
            wire_bytes=wire,
            model_wire_bytes=self.estimate.wire_per_step() if self.estimate is not None else None,
            retained_per_layer=float(layers["measured_bytes"].mean()) if layers is not None and len(layers) else None,
            peak_allocated=max(self.peak_allocated.values(), default=0),
        )

    @cached_property
    def model_sweep(self) -> ModelSweep | None:
        """The cost model across sequence lengths at this run's declared model (None when it
        leaves a size undeclared): what the report and the dashboard's Compare page draw."""
        return sweep_model(self.model)


def analyse_run(
    source: Path | str | RunTrace,
    *,
    flags: ShapeValues | Declarations | None = None,
    allow: tuple[str, ...] = (),
    strict: bool = False,
    k: int = 2,
    parts: tuple[str, ...] = PARTS,
    load_options: LoadOptions | LoadOptionValues | None = None,
    grad_dtype: str | None = None,
    fail_fast: bool = False,
    attention_only: bool = False,
    grad_sync: bool = True,
    judge: bool = True,
) -> RunAnalysis:
    """Analyse one run (a folder, a trace file, or a loaded RunTrace). ``flags``: ModelShape
    fields the user passed; ``parts``: which of collectives / sharding to compute;
    ``load_options``: sptrace.run.LoadOptions (or the mapping LoadOptions.of takes);
    ``fail_fast``: raise before any trace is parsed when the sharding
    check's B, S or H is declared nowhere (``sptrace check``; views show the reason instead);
    ``judge=False``: the facts alone, no check run (``sptrace whatif``, which reports none).

    A map over ranks (sptrace.run.map: each rank summarized where it is parsed, on the
    executor's workers) and a reduce over the summaries, here: matching, timing, the cost-model
    and cross-rank checks, the sharding check."""
    options = LoadOptions.of(load_options)
    if isinstance(source, RunTrace):
        run, path = source, source.root
        declared = declared_model(run.run_info, flags)
        production = _production(run.run_info, flags)
        if fail_fast:
            require_sharding_shape(declared, path)
        spec = MapSpec(parts, declared.dtype_bytes, hidden=declared.hidden)
        results: Mapping[int, RankResult] | GatheredRanks = {t.rank: summarize(t, spec) for t in run}
    else:
        path = Path(source)
        found = RunFiles.scan(path)
        declared = declared_model(found.run_info, flags)
        production = _production(found.run_info, flags)
        if fail_fast:
            require_sharding_shape(declared, path, found.notes)
            if "sharding" in parts:
                require_memory_events(found.files[0], options.cache, options.cache_root)
        spec = MapSpec(parts, declared.dtype_bytes, options.cache, options.cache_dir, hidden=declared.hidden)
        run, results = gather_run(found, spec, skip_bad=options.skip_bad, executor=options.executor)
    checks = CheckOptions(allow, strict, k, grad_dtype, attention_only, grad_sync)
    return reduce_run(run, path, results, declared=declared, parts=parts, options=checks, judge=judge,
                      production=production)  # fmt: skip


def _production(run_info: object, flags: ShapeValues | Declarations | None) -> tuple[tuple[str, ShapeValues], ...]:
    """run.json's production block, then the user's (a --config file's, --at)."""
    return production_declared(run_info, flags.production if isinstance(flags, Declarations) else ())


def reduce_run(
    run: RunTrace,
    path: Path | None,
    results: Mapping[int, RankResult] | GatheredRanks,
    *,
    declared: ModelShape | None = None,
    parts: tuple[str, ...] = PARTS,
    options: CheckOptions | None = None,
    judge: bool = True,
    production: tuple[tuple[str, ShapeValues], ...] = (),
) -> RunAnalysis:
    """The reduce over the ranks' summaries (gathered as the map made them: sptrace.run.gather;
    or sptrace.run.map.RankResult by rank): the cross-rank facts, the model resolved once from
    them and ``declared`` (sptrace.resolve; run.json's alone by default), then every check
    (sptrace.checks.registry)."""
    ranks = results if isinstance(results, GatheredRanks) else gather_results(results[r] for r in sorted(results))
    collectives = merge_collectives([ranks.frame("collectives")])
    # (kept whether or not the model is declared: sptrace diff compares retained bytes without it)
    retained = ranks.ranked_retained() if "sharding" in parts else ()
    model = resolve_model(declared or declared_model(run.run_info), run, collectives, retained)
    timing = ranks.ranked_timing()
    matching, p2p, critical, graphs = _cross_rank(collectives, ranks, run.world_size, timing, parts)
    lanes = ([ranks.frame("step_work")], [ranks.frame("flops")])
    balance = compute_balance(*lanes, module_layers(collectives), model) if "path" in parts else None
    facts = CheckFacts(
        ranks=tuple(sorted(run.ranks)), world_size=run.world_size, missing_ranks=tuple(sorted(run.missing_ranks)),
        collectives=collectives, matching=matching, timing=timing, retained=retained, critical_path=critical,
        p2p=p2p, options=options or CheckOptions(),
    )  # fmt: skip
    return RunAnalysis(
        path=path, run=run, model=model, warnings=tuple(run.warnings), collectives=collectives, matching=matching,
        timing=timing, retained=retained, compute_lanes=ranks.compute, p2p=p2p, critical_path=critical,
        phases=ranks.frame("phases"), memory=ranks.frame("memory"), module_times=ranks.frame("module_times"),
        peak_allocated=dict(sorted(ranks.peak_allocated.items())), balance=balance, replay_graphs=graphs,
        reports=run_checks(facts, model, parts) if judge else {}, production=production,
    )  # fmt: skip


def _cross_rank(
    collectives: pd.DataFrame,
    ranks: GatheredRanks,
    world_size: int,
    timing: tuple[RankTiming, ...],
    parts: tuple[str, ...],
) -> tuple[Matching | None, P2PReport | None, CriticalPath | None, tuple[ReplayGraph, ...]]:
    """The collectives matched across ranks, sends paired with receives, the critical path and the
    replay graphs of the profiled steps (each None or empty when its part was not asked for or the
    run has none)."""
    if "collectives" not in parts:
        return None, None, None, ()
    matching = match_collectives(collectives, world_size)
    p2p = None
    if len(collectives) and collectives["kind"].isin(["send", "recv"]).any():
        compute = joined(ranks.compute, COMPUTE_COLUMNS)
        p2p = analyse_point_to_point(collectives, compute, matching.pairing)
    work = ranks.work  # (walked rank by rank, each lane read when the path reaches its rank: never joined)
    critical = run_critical_path(collectives, matching, list(timing), work) if "path" in parts else None
    graphs = replay_graphs(collectives, matching, list(timing), work) if "whatif" in parts else ()
    return matching, p2p, critical, graphs


class AnalyseOptions(TypedDict, total=False):
    """analyse_run's keyword options, for callers that pass them through (the commands, the
    dashboard's store, try_analyse)."""

    flags: ShapeValues | Declarations | None
    allow: tuple[str, ...]
    strict: bool
    k: int
    parts: tuple[str, ...]
    load_options: LoadOptions | LoadOptionValues | None
    grad_dtype: str | None
    fail_fast: bool
    attention_only: bool
    grad_sync: bool
    judge: bool


def try_analyse(source: Path | str, **options: Unpack[AnalyseOptions]) -> RunAnalysis | SptraceError:
    """analyse_run, or the error that made the run unusable (for views over many runs)."""
    try:
        return analyse_run(source, **options)
    except SptraceError as exc:
        return exc
