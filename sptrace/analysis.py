"""Every analysis of one run, built in one place: ``analyse_run`` -> ``RunAnalysis``.

``sptrace check``, ``analyze``, ``report``, ``dash``, ``demo`` and ``sweep`` all render this one
typed result, so they can never disagree: load -> collectives -> matching and timing -> the
cost model check -> retained tensors -> the sharding check. What the run does not declare is
unknown (sptrace.vocab.shape.ModelShape); an analysis that needs it is left out with the reason,
naming the flag to pass, instead of running on a guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from sptrace.checks.comm import CommReport, check_collectives
from sptrace.checks.crossrank import CrossRankReport, check_cross_rank
from sptrace.checks.findings import Finding, Verdict
from sptrace.checks.p2p import check_point_to_point
from sptrace.checks.registry import COLLECTIVES, SHARDING, CheckFacts, CheckReport, run_checks
from sptrace.checks.sharding import NEEDS as SHARDING_NEEDS
from sptrace.checks.sharding_verdict import ShardingReport, check_sharding
from sptrace.costmodel import CommEstimate, estimate_comm
from sptrace.costmodel.activations import activation_bytes_at_dtype
from sptrace.costmodel.comm import undeclared_sizes
from sptrace.detect.allocations import Retention
from sptrace.detect.infer import layers_dtype
from sptrace.detect.timing import MODULE_TIME_COLUMNS, RankTiming, step_sources
from sptrace.load.trace import RunFiles, RunTrace
from sptrace.reduce.critical import CriticalPath, run_critical_path
from sptrace.reduce.matching import Matching, match_collectives
from sptrace.reduce.p2p import P2PReport, analyse_point_to_point
from sptrace.reduce.peers import merge_collectives
from sptrace.run import LoadOptions
from sptrace.run.map import (
    COMPUTE_COLUMNS,
    MEMORY_COLUMNS,
    PHASE_COLUMNS,
    MapSpec,
    RankResult,
    map_run,
    summarize,
)
from sptrace.run.options import LoadOptionValues
from sptrace.sweep import ModelSweep, sweep_model
from sptrace.vocab.errors import SptraceError, UsageError
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.markers import SAVED
from sptrace.vocab.shape import FIELDS, Declarations, ModelShape, ShapeValues
from sptrace.vocab.units import count, rank_ranges

PARTS = ("collectives", "sharding", "path")
"""What analyse_run computes by default: collectives (with matching, timing and the cost-model
check), the sharding check and the critical path across ranks (``path``, with ``collectives``);
``modules`` (each module's own time, for sptrace diff) on request."""


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
    peak_allocated: dict[int, int] = field(default_factory=dict)
    """Per rank, the largest allocated memory a [memory] event recorded (bytes)."""
    p2p: P2PReport | None = None
    """Sends paired with receives, ring steps, overlap and balance (None without point-to-point)."""
    module_times: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    """Each rank's own time per module, forward and backward (MODULE_TIME_COLUMNS, ms)."""
    critical_path: CriticalPath | None = None
    """The chain of work, transfers and waiting across ranks that set the step time."""
    reports: Mapping[str, CheckReport] = field(default_factory=dict)
    """Every check's report by name, the run's own (COLLECTIVES, SHARDING, where computed) first,
    then the registered checks' (sptrace.checks.registry): what the views render generically."""

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


def declared_model(run_info: JSONObject | None, flags: ShapeValues | Declarations | None = None) -> ModelShape:
    """run.json's declared config, overridden by flags (what is known before any trace is read)."""
    declared = run_info.get("config") if isinstance(run_info, dict) else None
    if declared is None and isinstance(run_info, dict) and any(k in FIELDS for k in run_info):
        declared = run_info  # written flat, shaped like profile_step's run_info
    model = ModelShape.from_mapping(declared if isinstance(declared, dict) else None, "run.json")
    if isinstance(flags, Declarations):  # a --config file, then the flags
        return flags.apply(model)
    return model.override("flags", **dict(flags)) if flags else model


def resolve_model(run: RunTrace, flags: ShapeValues | Declarations | None = None) -> ModelShape:
    """run.json's declared config, overridden by flags; P read off the trace when it leaves
    one answer (the run's only process group), saying so in provenance."""
    model = declared_model(run.run_info, flags)
    if model.sp_size is None:
        groups = {(g.get("pg_name"), g.get("pg_size")) for t in run for g in t.process_groups if isinstance(g, dict)}
        if len(groups) == 1:
            ((_, size),) = groups
            if isinstance(size, int) and size > 0:
                model = model.override(f"the run's only process group ({count(size, 'rank')})", sp_size=size)
    if model.kv_heads is None and model.heads is not None:  # no GQA declared: as many kv heads as heads
        model = model.override("equal to heads (no --kv-heads declared)", kv_heads=model.heads)
    return model


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
) -> RunAnalysis:
    """Analyse one run (a folder, a trace file, or a loaded RunTrace). ``flags``: ModelShape
    fields the user passed; ``parts``: which of collectives / sharding to compute;
    ``load_options``: sptrace.run.LoadOptions (or the mapping LoadOptions.of takes);
    ``fail_fast``: raise before any trace is parsed when the sharding
    check's B, S or H is declared nowhere (``sptrace check``; views show the reason instead).

    A map over ranks (sptrace.run.map: each rank summarized where it is parsed, on the
    executor's workers) and a reduce over the summaries, here: matching, timing, the cost-model
    and cross-rank checks, the sharding check."""
    options = LoadOptions.of(load_options)
    if isinstance(source, RunTrace):
        run, path = source, source.root
        declared = declared_model(run.run_info, flags)
        if fail_fast:
            _require_sharding_shape(declared, path)
        spec = MapSpec(parts, declared.dtype_bytes, hidden=declared.hidden)
        results = {t.rank: summarize(t, spec) for t in run}
    else:
        path = Path(source)
        found = RunFiles.scan(path)
        declared = declared_model(found.run_info, flags)
        if fail_fast:
            _require_sharding_shape(declared, path, found.notes)
            if "sharding" in parts:
                _require_memory_events(found.files[0], options)
        spec = MapSpec(parts, declared.dtype_bytes, options.cache, options.cache_dir, hidden=declared.hidden)
        run, results = map_run(found, spec, skip_bad=options.skip_bad, executor=options.executor)
    return reduce_run(
        run, path, results, flags=flags, allow=allow, strict=strict, k=k, parts=parts, grad_dtype=grad_dtype,
        attention_only=attention_only, grad_sync=grad_sync,
    )  # fmt: skip


def _require_sharding_shape(declared: ModelShape, path: Path | None, notes: Iterable[str] = ()) -> None:
    """B, S and H come only from the user (run.json, --config, flags): every one missing, named
    in one line. P may come from the trace's only process group, so it is named with that
    condition."""
    missing = declared.missing(("batch", "seq", "hidden"))
    if missing:
        flags = ", ".join(FIELDS[n][0] for n in missing)
        also = " (and --sp, unless the trace holds a single process group)" if declared.sp_size is None else ""
        said = "".join(f"; {n}" for n in notes)  # run.json's keys that are no field, say (a misspelt size)
        raise UsageError(f"{path}: the sharding check needs {flags}{also}, which neither run.json, --config "
                         f"nor a flag declares{said}")  # fmt: skip


def _require_memory_events(first: Path, options: LoadOptions) -> None:
    """Before any parse: a first trace that holds neither [memory] events nor sptrace.saved
    records leaves its rank unjudged, so the sharding check could only say CANNOT DECIDE; said
    at once (a trace already in the cache is parsed in no time: not probed)."""
    from sptrace.load.cache import cached_entry
    from sptrace.load.trace import holds_any

    if options.cache and cached_entry(options.cache_root, first) is not None:
        return
    if not holds_any(first, (b'"[memory]"', SAVED.encode())):
        raise UsageError(
            f"{first}: the trace has neither [memory] events nor sptrace.saved records, so no retained tensor can be "
            "judged: profile with profile_memory=True (sptrace.instrument adds exact shapes)"
        )


def _activation_dtype(model: ModelShape, retained: tuple[Retention, ...], notes: list[str]) -> ModelShape:
    """The activation dtype: declared, else the one element type the trace's ops took their
    [B, S/P, H] activations in (any layout). A declaration the trace contradicts is said in
    ``notes``, naming both."""
    B, H, s = model.batch, model.hidden, model.local_seq
    residual = {(B, s, H), (s, B, H), (B * s, H)} | ({(s, H)} if B == 1 else set())
    seen: set[str] = set()
    for r in retained:
        for shape, kinds in r.shape_dtypes.items():
            if shape in residual:
                seen |= kinds
    if model.dtype is not None:
        if seen and model.dtype not in seen:
            # an error would stop mixed precision (autocast keeps an fp32 residual stream beside
            # bf16 matmuls): said, and the declaration kept for tensors that record no type
            notes.append(
                f"the declared dtype {model.dtype} is not the trace's: its ops took the [B, S/P, H] = [{B}, {s}, {H}] "
                f"activations as {', '.join(sorted(seen))} (mixed precision?); a tensor without a recorded type is "
                f"read at {model.dtype}'s size"
            )
        return model
    if len(seen) == 1:
        return model.override(f"the trace (its [B, S/P, H] activations are {next(iter(seen))})", dtype=next(iter(seen)))
    return model


def gradient_element_size(
    collectives: pd.DataFrame, model: ModelShape, declared: str | None, k: int = 2
) -> tuple[int | None, str | None]:
    """(bytes, note) of the gradients' element: declared, else the one dtype of the trace's
    gradient collectives (those of the scheme's gradient kinds, in backward, outside every layer
    or of exactly the element count the model gives them), else unknown. A declaration the trace
    contradicts is an error naming both."""
    from math import prod

    from sptrace.vocab.dtypes import element_size

    if model.scheme == "megatron":  # its step-level all-reduce is the norms', in the activation dtype
        return 4, None
    seen: set[str] = set()
    if len(collectives):
        try:
            shape = estimate_comm(model, k=k, grad_bytes=None)
        except (UsageError, ValueError):
            shape = None
        grads = [c for c in shape.collectives if c.module == "grad_sync" or "gradient" in c.what] if shape else []
        kinds = {c.kind for c in grads}
        counts = {prod(c.in_shape) for c in grads}
        c = collectives
        rows = c[c["kind"].isin(kinds) & c["phase"].isin(["backward", "optimizer"])
                 & (c["layer"].isna() | c["in_elems"].isin(counts))]  # fmt: skip
        seen = {str(d) for d in rows["dtype"].dropna() if element_size(d)}
    if declared is not None:
        size = element_size(declared)
        if size is None:
            raise UsageError(f"--grad-dtype {declared!r} is not a dtype")
        if seen and {element_size(d) for d in seen} != {size}:
            raise UsageError(
                f"--grad-dtype {declared} contradicts the trace: its gradient collectives are {', '.join(sorted(seen))}"
            )
        return size, None
    if len({element_size(d) for d in seen}) == 1:
        dtype = sorted(seen)[0]
        return element_size(
            dtype
        ), f"gradient element size {element_size(dtype)} bytes: the trace's gradient collectives are {dtype}"
    return None, (
        "gradient element size unknown (pass --grad-dtype): the gradient collectives are compared by count, not bytes"
    )


def reduce_run(
    run: RunTrace,
    path: Path | None,
    results: Mapping[int, RankResult],
    *,
    flags: ShapeValues | Declarations | None = None,
    allow: tuple[str, ...] = (),
    strict: bool = False,
    k: int = 2,
    parts: tuple[str, ...] = PARTS,
    grad_dtype: str | None = None,
    attention_only: bool = False,
    grad_sync: bool = True,
) -> RunAnalysis:
    """The cross-rank reduce over the ranks' summaries (sptrace.run.map.RankResult).
    ``grad_dtype``: the element type of the gradients replicated weights communicate, when the
    user declares it (else read from the trace's step-level gradient all-reduces, else unknown)."""
    model = resolve_model(run, flags)
    ranked = [results[r] for r in sorted(results)]
    timing = [r.timing for r in ranked if r.timing is not None]
    compute = [r.compute for r in ranked if r.compute is not None]
    collectives = merge_collectives(results[r].collectives for r in sorted(results))
    if model.layers is None:
        layers = set(collectives["layer"].dropna().astype(int)) if len(collectives) else set()
        if layers:
            model = model.override(
                f"the trace (layers {min(layers)}-{max(layers)} communicate)", layers=max(layers) + 1
            )
    if model.dtype is None:  # the activations' element type: the one the layers' collectives carry
        dtype = layers_dtype(collectives)
        if dtype is not None:
            model = model.override(f"the trace (the collectives inside its layers are {dtype})", dtype=dtype)
    matching = match_collectives(collectives, run.world_size) if "collectives" in parts else None
    missing = (f"ranks without a trace: {rank_ranges(run.missing_ranks)} ({len(run.missing_ranks)} of "
               f"{run.world_size})") if run.missing_ranks else None  # fmt: skip
    estimate = comm = crossrank = p2p = critical = None
    work = {r.trace.rank: r.work for r in ranked if r.work is not None}  # (walked rank by rank: never joined)
    comm_unavailable = None
    if "collectives" in parts:
        p2p_found: list[Finding] = []
        if len(collectives) and collectives["kind"].isin(["send", "recv"]).any():
            assert matching is not None
            p2p = analyse_point_to_point(collectives, _concat(compute, COMPUTE_COLUMNS), matching.pairing)
            # they count in whichever verdict analyze gives: against the model, or across ranks
            p2p_found = check_point_to_point(p2p, sorted(run.ranks))
        p2p_notes = p2p.notes if p2p is not None else []
        scope = {"attention_only": attention_only, "grad_sync": grad_sync}
        comm_unavailable, stand_in = _cost_model_needs(model, k=k, **scope)
        grad_bytes, grad_note = (
            gradient_element_size(collectives, stand_in, grad_dtype, k) if stand_in is not None else (None, None)
        )
        if stand_in is not None:
            try:
                estimate = estimate_comm(stand_in, k=k, grad_bytes=grad_bytes, **scope)
            except (UsageError, ValueError) as exc:
                comm_unavailable = str(exc)
            else:  # what the user declared, not the stand-in values of sizes the estimate does not use
                estimate = dataclasses.replace(estimate, cfg=model)
        if estimate is not None:
            over = None
            if str(model.provenance.get("layers", "")).startswith("the trace"):
                over = (f"for the {count(model.layers, 'layer')} the trace shows (L not declared: pass --layers, or a "
                        "window that misses a layer compares fewer)")  # fmt: skip
            notes = [n for n in (grad_note, missing and f"{missing}; analysed the rest") if n]
            comm = check_collectives(collectives, estimate, sorted(run.ranks), matching, also=p2p_found,
                                     notes=[*notes, *p2p_notes], scope=over)  # fmt: skip
        crossrank = check_cross_rank(collectives, matching, sorted(run.ranks), comm_unavailable, also=p2p_found,
                                     notes=[*([missing] if missing else []), *p2p_notes])  # fmt: skip
        if "path" in parts:
            critical = run_critical_path(collectives, matching, timing, work)
    expected_act = activation_bytes_at_dtype(model)
    retained: tuple[Retention, ...] = ()
    sharding = None
    sharding_unavailable = None
    if "sharding" in parts:
        # (kept whether or not the model is declared: sptrace diff compares retained bytes without it)
        retained = tuple(r.retained for r in ranked if r.retained is not None)
        sharding_unavailable = model.why_missing(SHARDING_NEEDS, "the sharding check")
        if sharding_unavailable is None:
            sharding_unavailable = model.seq_split_problem()
        if sharding_unavailable is None:
            dtype_notes: list[str] = []
            model = _activation_dtype(model, retained, dtype_notes)
            expected_act = activation_bytes_at_dtype(model)
            sharding = check_sharding(list(retained), model, allow=allow, strict=strict,
                                      expected_per_layer=expected_act, notes=dtype_notes,
                                      missing_ranks=sorted(run.missing_ranks))  # fmt: skip
    analysis = RunAnalysis(
        path=path, run=run, model=model, warnings=tuple(run.warnings), collectives=collectives, matching=matching,
        timing=tuple(timing), estimate=estimate, comm=comm, comm_unavailable=comm_unavailable, retained=retained,
        sharding=sharding, sharding_unavailable=sharding_unavailable, expected_activation_bytes=expected_act,
        phases=_concat([r.phases for r in ranked if r.phases is not None], PHASE_COLUMNS),
        memory=_concat([r.memory for r in ranked if r.memory is not None], MEMORY_COLUMNS),
        compute=_concat(compute, COMPUTE_COLUMNS), crossrank=crossrank, p2p=p2p,
        module_times=_concat([r.module_times for r in ranked if r.module_times is not None], MODULE_TIME_COLUMNS),
        peak_allocated={r.trace.rank: r.peak_allocated for r in ranked if r.peak_allocated is not None},
        critical_path=critical,
    )  # fmt: skip
    return dataclasses.replace(analysis, reports=_reports(analysis, parts))


def _reports(a: RunAnalysis, parts: tuple[str, ...]) -> dict[str, CheckReport]:
    """The run's own checks as CheckReports, then every registered check's."""
    out: dict[str, CheckReport] = {}
    if "collectives" in parts:
        own = a.comm or a.crossrank
        title = "collectives against the cost model" if a.comm is not None else "collectives across ranks"
        out[COLLECTIVES] = CheckReport(COLLECTIVES, title, a.collectives_verdict, tuple(own.findings) if own else (),
                                       tuple(own.notes) if own else (), unavailable=a.comm_unavailable)  # fmt: skip
    if "sharding" in parts:
        sh = a.sharding
        found, notes = (tuple(sh.findings), tuple(sh.notes)) if sh else ((), ())
        out[SHARDING] = CheckReport(SHARDING, "activations kept for backward are sharded", sh.verdict if sh else None,
                                    found, notes, gate=True, unavailable=a.sharding_unavailable)  # fmt: skip
    facts = CheckFacts(
        ranks=tuple(sorted(a.run.ranks)), world_size=a.run.world_size, missing_ranks=tuple(sorted(a.run.missing_ranks)),
        collectives=a.collectives, matching=a.matching, timing=a.timing, retained=a.retained,
        critical_path=a.critical_path,
    )  # fmt: skip
    return out | run_checks(facts, a.model, parts)


def _cost_model_needs(model: ModelShape, **options: Any) -> tuple[str | None, ModelShape | None]:
    """(why the cost model cannot run, naming every undeclared size it depends on; or the config
    to estimate with). Sizes whose value changes none of the scheme's collectives (F for
    Megatron-SP's) are not asked for (sptrace.costmodel.comm.undeclared_sizes)."""
    needed, stand_in = undeclared_sizes(model, **options)
    if stand_in is not None:
        return None, stand_in
    gqa = "kv_heads" in needed and "heads" in needed
    flags = ", ".join(FIELDS[n][0] for n in needed if not (gqa and n == "kv_heads"))
    also = " (--kv-heads defaults to --heads)" if gqa else ""
    of = f" of {model.scheme}" if model.scheme else ""
    them = "it" if len(needed) == 1 else "them"
    return f"the cost model{of} needs {flags}{also}; pass {them}, or --config FILE", None


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def try_analyse(source: Path | str, **options: Any) -> RunAnalysis | SptraceError:
    """analyse_run, or the error that made the run unusable (for views over many runs)."""
    try:
        return analyse_run(source, **options)
    except SptraceError as exc:
        return exc
