"""The ``sptrace`` command. Each subcommand is a small function; errors are raised as
``SptraceError`` and turned into one line and an exit code here, once."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from sptrace import __version__
from sptrace.config import DTYPES, FAULTS, RECOMPUTE, SCHEMES, StepConfig
from sptrace.errors import SptraceError, UsageError
from sptrace.units import human_bytes

DEMO_DIR = Path("sptrace-demo")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: bad flags become one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def _log(msg: str) -> None:
    print(f"sptrace: {msg}", file=sys.stderr, flush=True)


def _add_model_flags(p: argparse.ArgumentParser, *, with_seq: bool = True) -> None:
    d = StepConfig()
    g = p.add_argument_group("model (defaults are sized for a 2-core machine)")
    g.add_argument("--layers", type=int, default=d.layers, help=f"L blocks (default {d.layers})")
    g.add_argument("--batch", type=int, default=d.batch, help=f"B micro-batch (default {d.batch})")
    if with_seq:
        g.add_argument("--seq", type=int, default=d.seq, help=f"S sequence length (default {d.seq})")
    g.add_argument("--hidden", type=int, default=d.hidden, help=f"H width (default {d.hidden})")
    g.add_argument("--heads", type=int, default=d.heads, help=f"a query heads (default {d.heads})")
    g.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"g kv heads, GQA (default {d.kv_heads})")
    g.add_argument("--ffn", type=int, default=d.ffn, help=f"F MLP width (default {d.ffn})")
    g.add_argument("--dtype", choices=tuple(DTYPES), default=d.dtype)
    g.add_argument("--zero3", action="store_true", help="shard replicated weights with FSDP2 (ulysses, hybrid)")
    g.add_argument("--recompute", choices=RECOMPUTE, default=d.recompute, help="selective: recompute core attention")
    g.add_argument(
        "--fault",
        choices=tuple(FAULTS),
        help="inject a fault into one layer: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )
    g.add_argument("--fault-layer", type=int, help="layer the fault goes into (default: the last)")
    g.add_argument("--seed", type=int, default=d.seed)


def _config_from(args: argparse.Namespace, scheme: str, nproc: int) -> StepConfig:
    return StepConfig(
        scheme=scheme, sp_size=nproc, layers=args.layers, batch=args.batch, seq=args.seq,
        hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads, ffn=args.ffn,
        dtype=args.dtype, zero3=args.zero3, recompute=args.recompute, fault=args.fault,
        fault_layer=args.fault_layer, seed=args.seed,
    )  # fmt: skip


def cmd_profile(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise UsageError("--nproc must be >= 1")
    cfg = _config_from(args, args.scheme, args.nproc)  # every flag is checked before launching
    from sptrace.launch import profile_reference

    run = profile_reference(
        cfg, Path(args.out), warmup=args.warmup, device=args.device, force=args.force,
        instrument=not args.no_instrument, log=_log,
    )  # fmt: skip
    _log(
        f"wrote {run.world_size} traces ({run.trace_bytes / 2**20:.1f} MiB) and run.json to "
        f"{run.out_dir} in {run.seconds:.0f} s"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The README's main job: profile the three schemes, then show where the results are."""
    from sptrace.launch import profile_reference

    out = Path(args.out)
    base = _config_from(args, "megatron", args.nproc)
    runs = []
    for scheme in SCHEMES:
        cfg = dataclasses.replace(base, scheme=scheme)
        runs.append(profile_reference(cfg, out / scheme, warmup=args.warmup, device=args.device, force=True, log=_log))
    print(f"Profiled one training step of each scheme on {args.nproc} ranks:")
    for run in runs:
        print(f"  {run.out_dir}/  ({run.world_size} x rank*.pt.trace.json.gz, run.json; {run.seconds:.0f} s)")
    from sptrace.pipeline import analyse_run

    analyses = [analyse_run(run.out_dir) for run in runs]  # once per run, for both verdicts
    print("\nCollectives against the cost model (sptrace analyze RUN for the details):")
    for run, a in zip(runs, analyses):
        print(f"  {run.out_dir.name:<9} {_comm_verdict(a['comm'])}")
    print("\nSharding of the activations kept for backward (sptrace check RUN for the details):")
    for run, a in zip(runs, analyses):
        print(f"  {run.out_dir.name:<9} {_sharding_verdict(a['sharding'])}")
    if args.no_serve:
        print(f"\nsptrace dash {' '.join(str(r.out_dir) for r in runs)}   # to browse them")
        return 0
    from dashboards.app import serve

    print(f"\ndashboard: http://127.0.0.1:{args.port}/  (Ctrl-C stops it)", flush=True)
    serve([r.out_dir for r in runs], port=args.port)
    return 0


def _sharding_verdict(report) -> str:
    kept = report.saved.groupby("rank")["storage_bytes"].sum().max()
    if report.ok:
        per_rank = len(report.saved) // max(report.saved["rank"].nunique(), 1)
        return f"PASS: {per_rank} tensors, {human_bytes(kept)} kept per rank, all sharded"
    return f"FAIL: {len(report.findings)} full-size saves"


def _comm_verdict(report) -> str:
    per_rank = report.ranks["observed"].iloc[0]
    wire = report.ranks["observed_wire_bytes"].iloc[0]
    if report.ok:
        return f"MATCH: {per_rank} collectives and {human_bytes(wire)} on the wire per rank, as the model predicts"
    return f"MISMATCH: {len(report.findings)} findings"


def cmd_info(args: argparse.Namespace) -> int:
    """Ranks, world size, groups, events, and which analyses the traces allow."""
    import json
    import warnings

    from sptrace.load import describe, load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shown in the report instead
        run = load_run(
            args.path, cache=not args.no_cache, skip_bad=args.skip_bad, cache_dir=args.cache_dir, workers=args.workers
        )
    info = describe.describe_run(run)
    if args.format == "json":
        print(json.dumps(info, indent=2))
    else:
        print(describe.render_text(info))
    return 0


MODEL_SCHEMES = ("megatron", "ulysses", "ulysses-zero3", "hybrid", "hybrid-zero3")
_SIZE_FLAGS = ("layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn")


def cmd_model(args: argparse.Namespace) -> int:
    """The analytic table of a scheme's collectives and activation memory."""
    import json

    from sptrace.costmodel import PRESETS, activation_bytes_per_layer, estimate_comm, korthikanti_bytes_per_layer

    values = dict(PRESETS[args.preset]) if args.preset else {}
    attention_only = bool(values.pop("attention_only", False)) or args.attention_only
    for name in _SIZE_FLAGS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if args.sp is not None:
        values["sp_size"] = args.sp
    if args.dtype is not None:
        values["dtype"] = args.dtype
    if args.recompute is not None:
        values["recompute"] = args.recompute
    scheme, _, zero = args.scheme.partition("-")
    if "kv_heads" not in values and "heads" in values:
        values["kv_heads"] = values["heads"]
    cfg = StepConfig(scheme=scheme, zero3=bool(zero), **values)
    if args.k not in (1, 2):
        raise UsageError("--k must be 1 or 2")
    est = estimate_comm(cfg, k=args.k, attention_only=attention_only, grad_bytes=args.grad_bytes)
    act = activation_bytes_per_layer(cfg)
    if args.format == "json":
        out = est.to_dict()
        out["attention_only"] = attention_only
        out["activation_bytes_per_layer"] = act
        out["korthikanti_bytes_per_layer"] = {
            s: korthikanti_bytes_per_layer(
                s, seq=cfg.seq, batch=cfg.batch, hidden=cfg.hidden, heads=cfg.heads, tp=cfg.sp_size
            )
            for s in ("none", "tp", "tp_sp", "tp_sp_selective", "full_recompute")
        }
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{est.scheme}{' (attention only)' if attention_only else ''}: P={cfg.sp_size} L={cfg.layers} B={cfg.batch} "
        f"S={cfg.seq} H={cfg.hidden} a={cfg.heads} g={cfg.kv_heads} d={cfg.head_dim} F={cfg.ffn} {cfg.dtype}"
        + (f", ZeRO-3 k={est.k}" if cfg.zero3 else "")
    )
    print(
        f"\n{'phase':<9}{'kind':<15}{'module':<11}{'x/step':>7}  {'in -> out shape':<34}"
        f"{'in bytes':>12}{'wire/step':>12}  what"
    )
    for c in est.collectives:
        n = cfg.layers if c.per_layer else 1
        shapes = f"{list(c.in_shape)} -> {list(c.out_shape)}"
        print(
            f"{c.phase:<9}{c.kind:<15}{c.module:<11}{n:>7}  {shapes:<34}{human_bytes(c.in_bytes):>12}"
            f"{human_bytes(c.wire_bytes * n):>12}  {c.what}"
        )
    print("\nwire bytes sent per rank, one direction:")
    for kind in ("all_gather", "reduce_scatter", "all_to_all", "all_reduce"):
        if est.count(kind):
            print(f"  {kind:<15}{est.count(kind):>5} collectives  {human_bytes(est.wire_per_step(kind)):>12}")
    print(f"  {'per layer':<15}{'':>18}{human_bytes(est.wire_per_layer()):>12}  (layer-level collectives)")
    step = est.wire_per_step()
    print(f"  {'per step':<15}{est.count():>5} collectives  {human_bytes(step):>12}  ({step / 2**20:.2f} MiB)")
    for note in est.notes:
        print(f"  note: {note}")
    print("\nactivations kept per layer and rank (Korthikanti et al. Table 2, fp16 with dropout):")
    print(
        f"  this scheme ({'selective recompute' if cfg.recompute == 'selective' else 'no recompute'}): "
        f"{human_bytes(act)}"
    )
    if cfg.recompute != "selective":
        sel = korthikanti_bytes_per_layer(
            "tp_sp_selective", seq=cfg.seq, batch=cfg.batch, hidden=cfg.hidden, heads=cfg.heads, tp=cfg.sp_size
        )
        print(f"  with selective recompute of core attention: {human_bytes(sel)}")
    return 0


def _load_quietly(args: argparse.Namespace):
    import warnings

    from sptrace.load import load_run

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = load_run(
            args.path, cache=not args.no_cache, skip_bad=args.skip_bad, cache_dir=args.cache_dir, workers=args.workers
        )
    for w in seen:
        _log(f"warning: {w.message}")
    return run


def cmd_collectives(args: argparse.Namespace) -> int:
    """Every collective of every rank, one record each."""
    import json
    import math

    from sptrace.detect import COLUMNS, detect_run_collectives

    frame = detect_run_collectives(_load_quietly(args))
    if args.format == "csv":
        sys.stdout.write(frame.to_csv(index=False))
        return 0
    if args.format == "json":
        records = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
            for rec in frame[COLUMNS].to_dict(orient="records")
        ]
        print(json.dumps(records, indent=1, default=str))
        return 0
    if frame.empty:
        print("no collectives in this run")
        return 0
    print(
        f"{'rank':>4} {'kind':<15}{'group':<6}{'P':>3} {'dtype':<9}{'in':>11}{'out':>11}{'wire':>11}"
        f"{'start ms':>10}{'dur ms':>9} {'phase':<9}{'layer':>5}  module"
    )
    t0 = frame["start_us"].min()
    for r in frame.itertuples():
        layer = "" if r.layer is None or (isinstance(r.layer, float) and math.isnan(r.layer)) else int(r.layer)
        size = lambda v: "?" if v is None or (isinstance(v, float) and math.isnan(v)) else human_bytes(v)  # noqa: E731
        print(
            f"{r.rank:>4} {r.kind:<15}{r.group!s:<6}{r.group_size:>3} {r.dtype!s:<9}{size(r.in_bytes):>11}"
            f"{size(r.out_bytes):>11}{size(r.wire_bytes):>11}{(r.start_us - t0) / 1e3:>10.2f}{r.dur_us / 1e3:>9.2f} "
            f"{r.phase:<9}{layer!s:>5}  {r.module or ''}"
        )
    print(f"\n{len(frame)} collectives on {frame['rank'].nunique()} ranks; per rank and kind:")
    counts = frame.groupby(["kind"]).agg(n=("rank", "size"), wire=("wire_bytes", "sum"))
    ranks = frame["rank"].nunique()
    for kind, row in counts.iterrows():
        print(f"  {kind:<15}{row.n / ranks:>7.1f} per rank  {human_bytes(row.wire / ranks):>12} wire per rank")
    return 0


def _config_for(args: argparse.Namespace, run, what: str) -> StepConfig:
    """The step config of a run: run.json's, with flags overriding."""
    names = set(StepConfig.__dataclass_fields__)
    declared = (run.run_info or {}).get("config") or {}
    values: dict = {k: v for k, v in declared.items() if k in names}
    if args.scheme:
        scheme, _, zero = args.scheme.partition("-")
        values["scheme"], values["zero3"] = scheme, bool(zero)
    if "scheme" not in values:
        raise UsageError(f"{run.root or args.path}: no run.json to say which scheme this is; pass --scheme for {what}")
    for name in _SIZE_FLAGS:
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if getattr(args, "dtype", None):
        values["dtype"] = args.dtype
    values["sp_size"] = args.sp if getattr(args, "sp", None) else values.get("sp_size", run.world_size)
    if "kv_heads" not in values and "heads" in values:
        values["kv_heads"] = values["heads"]
    return StepConfig(**values)


def cmd_analyze(args: argparse.Namespace) -> int:
    """Observed collectives versus the scheme's; exit 0 when they match, 1 when not."""
    import json

    from sptrace.checks import check_collectives
    from sptrace.costmodel import estimate_comm
    from sptrace.detect import detect_run_collectives
    from sptrace.detect.matching import match_collectives

    run = _load_quietly(args)
    cfg = _config_for(args, run, "the model to compare with")
    if args.k not in (1, 2):
        raise UsageError("--k must be 1 or 2")
    est = estimate_comm(cfg, k=args.k)
    frame = detect_run_collectives(run)
    matching = match_collectives(frame)
    report = check_collectives(frame, est, sorted(run.ranks), matching)
    if run.missing_ranks:
        report.notes.append(f"ranks without a trace: {len(run.missing_ranks)} of {run.world_size}; analysed the rest")
    if args.format == "json":
        print(json.dumps({**report.to_dict(), "config": cfg.to_dict()}, indent=1, default=str))
        return 0 if report.ok else 1
    print(
        f"{est.scheme}: P={cfg.sp_size} L={cfg.layers} B={cfg.batch} S={cfg.seq} H={cfg.hidden} a={cfg.heads} "
        f"g={cfg.kv_heads} F={cfg.ffn} {cfg.dtype}; {len(run)} of {run.world_size} ranks"
    )
    print(f"\n{'rank':>4}{'collectives':>13}{'expected':>10}{'wire/step':>13}{'model':>13}{'missing':>9}{'extra':>7}")
    for r in report.ranks.itertuples():
        print(
            f"{r.rank:>4}{r.observed:>13}{r.expected:>10}{human_bytes(r.observed_wire_bytes):>13}"
            f"{human_bytes(r.expected_wire_bytes):>13}{r.missing:>9}{r.extra:>7}"
        )
    if not report.layers.empty:
        off = report.layers[report.layers["observed"] != report.layers["expected"]]
        if not off.empty:
            print("\nlayers whose counts differ from the model (rank, layer, phase: observed / expected):")
            for r in off.head(40).itertuples():
                print(f"  rank {r.rank}, layer {r.layer}, {r.phase}: {r.observed} / {r.expected}")
    if report.findings:
        print(f"\n{len(report.findings)} findings:")
        for f in report.findings[: args.max_findings]:
            print(f"  {f.severity}: {f.message}")
        if len(report.findings) > args.max_findings:
            print(f"  ... and {len(report.findings) - args.max_findings} more (--format json lists all)")
    for note in report.notes:
        print(f"note: {note}")
    if matching.offsets_us:
        spread = max(matching.offsets_us.values()) - min(matching.offsets_us.values())
        print(f"note: clock offsets across ranks span {spread:.0f} us (aligned on matched completions)")
    print("\nMATCH: the run communicates what its scheme must" if report.ok else "\nMISMATCH: see the findings above")
    return 0 if report.ok else 1


def cmd_check(args: argparse.Namespace) -> int:
    """Every activation kept for backward is sequence- or head-sharded: exit 0; else 1."""
    import json

    import pandas as pd

    from sptrace.checks.sharding import ShardingShape, check_sharding, render_junit
    from sptrace.costmodel import korthikanti_bytes_per_layer
    from sptrace.detect.allocations import detect_saved_activations
    from sptrace.errors import TraceError
    from sptrace.fileio import write_atomic

    run = _load_quietly(args)
    declared = (run.run_info or {}).get("config") or {}
    values = {
        k: getattr(args, k) if getattr(args, k) is not None else declared.get(k)
        for k in ("batch", "seq", "hidden", "heads")
    }
    missing = [k for k in ("batch", "seq", "hidden") if values[k] is None]
    if missing:
        flags = " ".join(f"--{k} N" for k in missing)
        raise UsageError(f"{run.root or args.path}: no run.json gives {', '.join(missing)}; pass {flags}")
    sp = args.sp or declared.get("sp_size") or run.world_size
    dtype = args.dtype or declared.get("dtype") or "float32"
    try:
        step = ShardingShape(batch=values["batch"], seq=values["seq"], hidden=values["hidden"], sp_size=sp,
                             element_size=DTYPES[dtype])  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    frames, without = [], []
    for trace in run:
        saved, ledger = detect_saved_activations(trace, element_size=step.element_size)
        if ledger.empty and saved.empty:
            without.append(trace.rank)
        frames.append(saved)
    if len(without) == len(run):
        raise TraceError(
            run.root or args.path,
            "the traces have no [memory] events: record them with torch.profiler(profile_memory=True) "
            "(sptrace profile and sptrace.profile_step do)",
        )
    expected = None
    if values["heads"]:
        expected = (
            korthikanti_bytes_per_layer(
                "tp_sp", seq=step.seq, batch=step.batch, hidden=step.hidden, heads=values["heads"], tp=step.sp_size
            )
            * step.element_size
            / 2
        )  # Korthikanti counts 2-byte activations
    report = check_sharding(
        pd.concat(frames, ignore_index=True), step, allow=tuple(args.allow), expected_per_layer=expected
    )
    if without:
        report.notes.append(f"ranks without [memory] events, not checked: {without}")
    if args.format == "json":
        text = json.dumps(report.to_dict(), indent=1, default=str) + "\n"
    elif args.format == "junit":
        text = render_junit(report, sorted(run.ranks))
    else:
        text = _render_check(report, run)
    if args.output:
        write_atomic(Path(args.output), text.encode())
        _log(f"wrote {args.output}: {'pass' if report.ok else f'{len(report.findings)} violations'}")
    else:
        sys.stdout.write(text)
    return 0 if report.ok else 1


def _render_check(report, run) -> str:
    s = report.step
    lines = [
        f"{run.root or ''}: B={s.batch} S={s.seq} H={s.hidden} P={s.sp_size}, {s.element_size}-byte activations; "
        f"{len(run)} ranks",
        "",
        f"{'rank':>4}{'saved':>7}{'seq-sharded':>13}{'head-sharded':>14}{'other':>7}{'full':>6}{'kept':>12}",
    ]
    for rank in sorted(run.ranks):
        mine = report.saved[report.saved["rank"] == rank]
        count = mine["class"].value_counts()
        lines.append(
            f"{rank:>4}{len(mine):>7}{count.get('seq-sharded', 0):>13}{count.get('head-sharded', 0):>14}"
            f"{count.get('other', 0) + count.get('unknown', 0):>7}{count.get('full', 0):>6}"
            f"{human_bytes(mine['storage_bytes'].sum()):>12}"
        )
    if not report.layers.empty:
        layer = report.layers.groupby("layer").agg(
            measured=("measured_bytes", "mean"), expected=("expected_bytes", "first")
        )
        lines.append("")
        for i, row in layer.iterrows():
            exp = (
                ""
                if row.expected != row.expected or row.expected is None
                else f" (Korthikanti: {human_bytes(row.expected)})"
            )
            lines.append(f"layer {i}: {human_bytes(row.measured)} kept per rank{exp}")
    lines.append("")
    for f in report.findings:
        lines.append(f"FAIL {f.message}")
    for n in report.notes:
        lines.append(f"note: {n}")
    lines.append(
        "PASS: every activation kept for backward is sharded"
        if report.ok
        else f"{len(report.findings)} full-size saves"
    )
    return "\n".join(lines) + "\n"


def cmd_report(args: argparse.Namespace) -> int:
    """A self-contained HTML report (plotly.js inlined once) over one or several runs."""
    from sptrace.fileio import write_atomic
    from sptrace.report.html import render_html

    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory")
    text = render_html(paths)
    write_atomic(Path(args.html), text.encode())
    _log(f"wrote {args.html} ({len(text) / 2**20:.1f} MiB, {len(paths)} runs)")
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag} is empty")
    return values


def cmd_sweep(args: argparse.Namespace) -> int:
    """Profile every scheme x sequence length, then the comparison table and the regression."""
    from sptrace.sweep import FIT, TABLE, run_sweep

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    for s in schemes:
        if s not in MODEL_SCHEMES:
            raise UsageError(f"--schemes: unknown scheme {s!r}; choose from {', '.join(MODEL_SCHEMES)}")
    seqs = _int_list(args.seqs, "--seq")
    args.seq = seqs[0]
    base = _config_from(args, "megatron", args.nproc)
    for s in schemes:  # every combination is checked before anything is launched
        for n in seqs:
            base.replace(scheme=s.removesuffix("-zero3"), zero3=s.endswith("-zero3"), seq=n)
    out = Path(args.out)
    table, fit = run_sweep(base, schemes, seqs, out, warmup=args.warmup, device=args.device, force=args.force, log=_log)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if fit:
        c = fit["coefficients"]
        terms = " + ".join(f"{v:.4g}*{k}" for k, v in c.items() if k != "intercept")
        r2 = "n/a" if fit["r2"] is None else f"{fit['r2']:.4f}"
        print(f"\nfit over {fit['runs']} runs: time_ms = {c['intercept']:.4g} + {terms}  (R^2 {r2})")
        if fit["underdetermined"]:
            print("note: fewer runs than the 5 coefficients; the fit is not determined")
    print(f"\nwrote {out / TABLE} and {out / FIT}; sptrace dash {out} opens the Compare page")
    return 0


def cmd_dash(args: argparse.Namespace) -> int:
    """Serve the Dash dashboard over the runs named here (and only those)."""
    from dashboards.app import serve
    from sptrace.sweep import TABLE, sweep_runs

    paths: list[Path] = []
    sweeps: list[Path] = []
    for p in map(Path, args.paths):
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory")
        # a sweep folder holds runs, not traces: serve its runs (the Compare page shows the sweep)
        if (p / TABLE).is_file():
            sweeps.append(p)
            paths.extend(sweep_runs(p))
        else:
            paths.append(p)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        _log(f"warning: serving on {args.host}: anyone who reaches this machine can read these runs")
    _log(f"dashboard on http://{args.host}:{args.port}/ over {len(paths)} runs (Ctrl-C stops it)")
    serve(paths, host=args.host, port=args.port, debug=args.debug, sweeps=sweeps)
    return 0


def _add_load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-cache", action="store_true", help="parse the traces again; do not read or write the table cache"
    )
    p.add_argument("--cache-dir", help="where parsed tables are cached (default: $XDG_CACHE_HOME/sptrace)")
    p.add_argument("--skip-bad", action="store_true", help="warn about unusable rank files and analyse the rest")
    p.add_argument(
        "--workers", type=int, help="processes that parse ranks in parallel (default: one per core for large runs)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sptrace", description="Trace profiler and analyzer for sequence-parallel training.")
    parser.add_argument("--version", action="version", version=f"sptrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("profile", help="profile one step of a reference model on N local ranks")
    p.add_argument("--scheme", choices=SCHEMES, required=True)
    p.add_argument("--nproc", type=int, default=8, help="ranks = sequence-parallel size P (default 8)")
    p.add_argument("--out", required=True, help="directory for rank*.pt.trace.json.gz and run.json")
    p.add_argument("--warmup", type=int, default=2, help="un-profiled steps before the profiled one")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: CUDA+NCCL when there are enough GPUs, else CPU+gloo",
    )
    p.add_argument("--force", action="store_true", help="replace a run already in --out")
    p.add_argument(
        "--no-instrument", action="store_true",
        help="record without sptrace's markers and saved-tensor records, like a foreign framework's trace",
    )  # fmt: skip
    _add_model_flags(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("demo", help="profile megatron, ulysses and hybrid on 8 ranks (the README's main job)")
    p.add_argument("--out", default=str(DEMO_DIR), help=f"default ./{DEMO_DIR}")
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--port", type=int, default=8050, help="dashboard port (on 127.0.0.1)")
    p.add_argument("--no-serve", action="store_true", help="profile and analyse, do not serve the dashboard")
    _add_model_flags(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("model", help="the analytic cost model: collectives, shapes, wire bytes, activation memory")
    p.add_argument("--scheme", choices=MODEL_SCHEMES, required=True)
    p.add_argument("--preset", choices=("seed-attention", "seed-3.6b"), help="the first article's configurations")
    p.add_argument("--sp", type=int, help="P, the sequence/tensor-parallel size (default 8)")
    for name in _SIZE_FLAGS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="default: the preset's, else sptrace profile's")
    p.add_argument("--dtype", choices=tuple(DTYPES))
    p.add_argument("--recompute", choices=RECOMPUTE)
    p.add_argument("--k", type=int, default=2, help="ZeRO-3 parameter gathers per step: 1, or 2 (default, DeepSpeed)")
    p.add_argument("--grad-bytes", type=int, default=4, choices=(2, 4), help="Ulysses gradient element size (4: fp32)")
    p.add_argument(
        "--attention-only", action="store_true", help="the attention block alone (the article's first example)"
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("collectives", help="every collective of every rank: kind, group, bytes, phase, layer")
    p.add_argument("path", help="a run directory or one trace file")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table")
    _add_load_flags(p)
    p.set_defaults(func=cmd_collectives)

    p = sub.add_parser("analyze", help="observed collectives versus the scheme's cost model (exit 1 on mismatch)")
    p.add_argument("path", help="a run directory or one trace file")
    p.add_argument("--scheme", choices=MODEL_SCHEMES, help="default: run.json's")
    p.add_argument("--sp", type=int, help="P (default: run.json's, else the world size)")
    for name in _SIZE_FLAGS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="default: run.json's")
    p.add_argument("--dtype", choices=tuple(DTYPES))
    p.add_argument("--k", type=int, default=2, help="ZeRO-3 parameter gathers per step (default 2)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--max-findings", type=int, default=30, help="findings shown in text (default 30)")
    _add_load_flags(p)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("check", help="activations kept for backward are sharded (exit 1 on a full-size save)")
    p.add_argument("path", help="a run directory or one trace file")
    for name in ("batch", "seq", "hidden", "heads"):
        p.add_argument(f"--{name}", type=int, help="default: run.json's")
    p.add_argument("--sp", type=int, help="P (default: run.json's, else the world size)")
    p.add_argument("--dtype", choices=tuple(DTYPES), help="activation dtype (default: run.json's, else float32)")
    p.add_argument(
        "--allow", action="append", default=[], metavar="MODULE_GLOB", help="modules allowed to keep full tensors"
    )
    p.add_argument("--format", choices=("text", "json", "junit"), default="text")
    p.add_argument("--output", help="write the report here (atomically) instead of stdout")
    _add_load_flags(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("sweep", help="profile schemes x sequence lengths, tabulate them and fit the regression")
    p.add_argument("--schemes", default="megatron,ulysses,hybrid", help="comma-separated (default: all three)")
    p.add_argument("--seq", dest="seqs", required=True, help="comma-separated sequence lengths, e.g. 128,256,512")
    p.add_argument("--out", required=True)
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--force", action="store_true", help="profile again runs that already exist")
    _add_model_flags(p, with_seq=False)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("dash", help="serve the dashboard over one or several runs (127.0.0.1 by default)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories or trace files")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8050)
    p.add_argument("--debug", action="store_true", help="Dash debug mode (never on unless asked)")
    p.set_defaults(func=cmd_dash)

    p = sub.add_parser("report", help="a self-contained HTML report over one or several runs")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories or trace files")
    p.add_argument("--html", required=True, help="the HTML file to write (atomically)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("info", help="what a run's traces hold and which analyses they allow")
    p.add_argument("path", help="a run directory (per-rank *.json / *.json.gz traces) or one trace file")
    p.add_argument("--format", choices=("text", "json"), default="text")
    _add_load_flags(p)
    p.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except SptraceError as exc:
        print(f"sptrace: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("sptrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sptrace collectives RUN | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
