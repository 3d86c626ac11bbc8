"""The reference models: ``sptrace profile``, ``sptrace demo`` (the README's main job) and
``sptrace sweep``. Every flag is checked (sptrace.reference_models.config) before anything launches."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sptrace.cli.common import log
from sptrace.reference_models.config import FAULTS, StepConfig
from sptrace.vocab.dtypes import ACTIVATION_DTYPES
from sptrace.vocab.errors import UsageError
from sptrace.vocab.jsontypes import JSONObject
from sptrace.vocab.shape import RECOMPUTE, SCHEME_CHOICES, SCHEMES, ShapeValues

if TYPE_CHECKING:  # pandas is imported when a sweep is tabulated, not to parse flags
    import pandas as pd

    from sptrace.sweep import Fit

DEMO_DIR = Path("sptrace-demo")
DEMO_SCHEMES = ("megatron", "ulysses", "hybrid")  # the first article's three systems


def _add_model_flags(p: argparse.ArgumentParser, *, with_seq: bool = True) -> None:
    d = StepConfig()
    g = p.add_argument_group("reference model (defaults are sized for a 2-core machine)")
    g.add_argument("--layers", type=int, default=d.layers, help=f"L blocks (default {d.layers})")
    g.add_argument("--batch", type=int, default=d.batch, help=f"B micro-batch (default {d.batch})")
    if with_seq:
        g.add_argument("--seq", type=int, default=d.seq, help=f"S sequence length (default {d.seq})")
    g.add_argument("--hidden", type=int, default=d.hidden, help=f"H width (default {d.hidden})")
    g.add_argument("--heads", type=int, default=d.heads, help=f"a query heads (default {d.heads})")
    g.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"g kv heads, GQA (default {d.kv_heads})")
    g.add_argument("--ffn", type=int, default=d.ffn, help=f"F MLP width (default {d.ffn})")
    g.add_argument("--dtype", choices=ACTIVATION_DTYPES, default=d.dtype)
    g.add_argument(
        "--zero3", action="store_true", help="shard replicated weights with FSDP2 (ulysses, hybrid, ring, usp)"
    )
    g.add_argument(
        "--ulysses-degree", type=int,
        help="usp: U ranks per Ulysses group, the ring spans P/U of them (default 2 when P is even)",
    )  # fmt: skip
    g.add_argument("--recompute", choices=RECOMPUTE, default=d.recompute, help="selective: recompute core attention")
    g.add_argument(
        "--fault", choices=tuple(FAULTS),
        help="inject a fault into one layer: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )  # fmt: skip
    g.add_argument("--fault-layer", type=int, help="layer the fault goes into (default: the last)")
    g.add_argument("--seed", type=int, default=d.seed)


class _StepValues(ShapeValues, total=False):
    """StepConfig's fields as the flags give them: the model's, and the reference models' own."""

    fault: str | None
    fault_layer: int | None
    seed: int


def _config_values(args: argparse.Namespace, scheme: str, nproc: int) -> _StepValues:
    return _StepValues(
        scheme=scheme, sp_size=nproc, layers=args.layers, batch=args.batch, seq=args.seq,
        hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads, ffn=args.ffn,
        dtype=args.dtype, zero3=args.zero3, recompute=args.recompute, fault=args.fault,
        fault_layer=args.fault_layer, seed=args.seed, ulysses_degree=_ulysses_degree(args, scheme, nproc),
    )  # fmt: skip


def _config_from(args: argparse.Namespace, scheme: str, nproc: int) -> StepConfig:
    return StepConfig(**_config_values(args, scheme, nproc))


SWEPT_BY_CONFIG = ("layers", "batch", "hidden", "heads", "kv_heads", "ffn", "dtype", "recompute", "ulysses_degree")
"""The sizes ``sweep --config`` takes from the file: S is swept, the schemes and P are flags."""


def _apply_config(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """The --config file's values for ``names``, where no flag on the command line set them (an
    argparse default is not a choice the user made)."""
    from sptrace.cli.common import read_config

    values = read_config(Path(args.config))
    typed = getattr(args, "argv", [])
    given = {a.split("=", 1)[0].lstrip("-").replace("-", "_") for a in typed if a.startswith("--")}
    for name in names:
        if name in values and name not in given:
            setattr(args, name, values[name])
    ignored = sorted(set(values) - set(names))
    if ignored:
        log(f"--config {args.config}: {', '.join(ignored)} not taken (sweep varies S; the schemes and P are "
            "--schemes and --nproc)")  # fmt: skip


def _ulysses_degree(args: argparse.Namespace, scheme: str, nproc: int) -> int:
    if args.ulysses_degree is not None:
        return args.ulysses_degree
    return 2 if scheme == "usp" and nproc % 2 == 0 else 1


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="profile one step of reference models on N local ranks, many configurations in one launch"
    )
    p.add_argument(
        "--scheme", choices=SCHEMES, action="append",
        help="the scheme; repeat it to profile several in one launch, each into OUT/SCHEME",
    )  # fmt: skip
    p.add_argument(
        "--matrix", metavar="FILE",
        help="a JSON file of named runs, each into OUT/NAME, in one launch per rank count: "
        '{"defaults": {...}, "runs": {"NAME": {"scheme": "megatron", "fault": "stray-full-save", ...}}}; '
        "a run's keys are this command's model flags (and nproc, instrument, lean), the flags given here "
        "are their defaults",
    )  # fmt: skip
    p.add_argument("--nproc", type=int, default=8, help="ranks = sequence-parallel size P (default 8)")
    p.add_argument(
        "--out", required=True,
        help="directory for rank*.pt.trace.json.gz and run.json (with several runs: for their folders)",
    )  # fmt: skip
    p.add_argument("--warmup", type=int, default=2, help="un-profiled steps before the profiled ones")
    p.add_argument(
        "--steps",
        type=int,
        default=2,
        help="profiled steps (default 2: the second shows which collective buffers the backend released)",
    )
    p.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="auto: CUDA+NCCL when there are enough GPUs, else CPU+gloo",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace a run already in --out")
    p.add_argument(
        "--no-instrument", action="store_true",
        help="record without sptrace's markers and saved-tensor records, like a foreign framework's trace",
    )  # fmt: skip
    p.add_argument(
        "--lean", action="store_true",
        help="profile without Python stacks (the profiler's costliest option); modules are named by the markers",
    )  # fmt: skip
    _add_model_flags(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("demo", help="profile megatron, ulysses and hybrid on 8 ranks (the README's main job)")
    p.add_argument("--out", default=str(DEMO_DIR), help=f"default ./{DEMO_DIR}")
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="profiled steps (default 2)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--port", type=int, default=8050, help="dashboard port (on 127.0.0.1)")
    p.add_argument("--no-serve", action="store_true", help="profile and analyse, do not serve the dashboard")
    _add_model_flags(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sweep", help="profile schemes x sequence lengths, tabulate them and fit the regression")
    p.add_argument(
        "--schemes", default="megatron,ulysses,hybrid",
        help="comma-separated, of megatron, ulysses, hybrid, ring, usp and their -zero3 (default: the first three)",
    )  # fmt: skip
    p.add_argument("--seq", dest="seqs", required=True, help="comma-separated sequence lengths, e.g. 128,256,512")
    p.add_argument("--out", required=True)
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="profiled steps of each run (default 2)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--force", action="store_true", help="profile again runs that already exist")
    _add_model_flags(p, with_seq=False)
    p.add_argument("--config", metavar="FILE", help="the model's sizes from a YAML or JSON file of run_info keys, as "
                   "the analysing commands take it (a flag wins over it; S, the scheme and P come from --seq, "
                   "--schemes and --nproc)")  # fmt: skip
    p.set_defaults(func=cmd_sweep)


# What a --matrix run may set, beside StepConfig's fields: how it is launched and recorded.
_RUN_KEYS = ("nproc", "instrument", "lean")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


_FIELD_TYPES: dict[str, type] = {
    f.name: {"int": int, "float": float, "bool": bool, "str": str}.get(str(f.type).split(" |")[0], object)
    for f in dataclasses.fields(StepConfig)
}


def _is(value: Any, want: type) -> bool:
    if want is bool or isinstance(value, bool):
        return isinstance(value, want)
    return isinstance(value, int if want is int else (int, float) if want is float else want)


def _matrix_runs(path: Path, args: argparse.Namespace) -> list[tuple[str, StepConfig, bool, bool]]:
    """(name, config, instrument, lean) of each run of a --matrix file, every value checked."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--matrix {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--matrix {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict) or not data["runs"]:
        raise UsageError(f'--matrix {path}: expected {{"runs": {{"NAME": {{...}}, ...}}}} with at least one run')
    unknown_top = sorted(set(data) - {"runs", "defaults"})
    if unknown_top:
        raise UsageError(f"--matrix {path}: unknown key {unknown_top[0]!r} (expected runs, defaults)")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise UsageError(f"--matrix {path}: defaults must be an object")
    fields = {f.name for f in dataclasses.fields(StepConfig)} - {"sp_size"}
    out = []
    for name, spec in data["runs"].items():
        where = f"--matrix {path}: run {name!r}"
        if not _NAME.fullmatch(name):
            raise UsageError(f"{where}: a run's name is a folder name (letters, digits, . _ + -)")
        if not isinstance(spec, dict):
            raise UsageError(f"{where}: expected an object of flags")
        merged: JSONObject = {}  # the run's keys over the defaults', as the file holds them
        for key, value in [*defaults.items(), *spec.items()]:
            key = key.replace("-", "_")
            if key not in fields and key not in _RUN_KEYS:
                raise UsageError(f"{where}: unknown key {key!r}")
            merged[key] = value
        if "scheme" not in merged:
            raise UsageError(f"{where}: no scheme")
        for key, value in merged.items():
            want = _FIELD_TYPES.get(key)
            if want is not None and value is not None and not _is(value, want):
                raise UsageError(f"{where}: {key} must be {want.__name__}, got {value!r}")
        nproc = merged.pop("nproc", args.nproc)
        instrument = merged.pop("instrument", not args.no_instrument)
        lean = merged.pop("lean", args.lean)
        if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
            raise UsageError(f"{where}: nproc must be an integer >= 1")
        for flag, value in (("instrument", instrument), ("lean", lean)):
            if not isinstance(value, bool):
                raise UsageError(f"{where}: {flag} must be true or false")
        try:
            cfg = StepConfig(**{**_config_values(args, str(merged["scheme"]), nproc), **merged})
        except TypeError as exc:
            raise UsageError(f"{where}: {exc}") from None
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        out.append((name, cfg, instrument, lean))
    return out


def cmd_profile(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise UsageError("--nproc must be >= 1")
    if not args.scheme and not args.matrix:
        raise UsageError("give --scheme (repeat it for several) or --matrix FILE")
    if args.scheme and args.matrix:
        raise UsageError("--scheme and --matrix do not go together: put the schemes in the matrix")
    from sptrace.launch import RunRequest, check_requests, profile_references

    out = Path(args.out)
    instrument = not args.no_instrument
    if args.matrix:  # every run is checked before anything launches
        requests = [
            RunRequest(cfg, out / name, inst, lean) for name, cfg, inst, lean in _matrix_runs(Path(args.matrix), args)
        ]
    elif len(args.scheme) == 1:  # one run: OUT is the run
        requests = [RunRequest(_config_from(args, args.scheme[0], args.nproc), out, instrument, args.lean)]
    else:
        twice = sorted({s for s in args.scheme if args.scheme.count(s) > 1})
        if twice:
            raise UsageError(f"--scheme {twice[0]} is given twice")
        requests = [RunRequest(_config_from(args, s, args.nproc), out / s, instrument, args.lean) for s in args.scheme]
    by_size: dict[int, list[RunRequest]] = {}
    for req in requests:
        by_size.setdefault(req.cfg.sp_size, []).append(req)
    for group in by_size.values():  # every launch is checked before the first starts
        check_requests(group, warmup=args.warmup, force=args.force, steps=args.steps)
    for size in sorted(by_size, reverse=True):  # one launch per rank count
        for run in profile_references(
            by_size[size], warmup=args.warmup, steps=args.steps, device=args.device, force=args.force, log=log
        ):
            log(f"wrote {run.world_size} traces ({run.trace_bytes / 2**20:.1f} MiB) and run.json to {run.out_dir} in "
                f"{run.seconds:.0f} s")  # fmt: skip
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The README's main job: profile the three schemes, analyse each once, show the verdicts."""
    from sptrace.launch import RunRequest, profile_references

    out = Path(args.out)
    base = _config_from(args, "megatron", args.nproc)
    requests = [RunRequest(base.replace(scheme=scheme), out / scheme) for scheme in DEMO_SCHEMES]
    runs = profile_references(
        requests, warmup=args.warmup, steps=args.steps, device=args.device, force=True, log=log
    )  # one launch
    from sptrace.analysis import analyse_run  # (after the launch: its import overlaps nothing)

    print(f"Profiled one training step of each scheme on {args.nproc} ranks, in one launch:")
    for run in runs:
        print(f"  {run.out_dir}/  ({run.world_size} x rank*.pt.trace.json.gz, run.json; {run.seconds:.0f} s)")
    analyses = [analyse_run(run.out_dir) for run in runs]  # once per run, for both verdicts
    print("\nCollectives against the cost model (sptrace analyze RUN for the details):")
    for run, a in zip(runs, analyses):
        line = a.comm.verdict.line() if a.comm else f"not checked: {a.comm_unavailable}"
        print(f"  {run.out_dir.name:<9} {line}")
    print("\nSharding of the activations kept for backward (sptrace check RUN for the details):")
    for run, a in zip(runs, analyses):
        line = a.sharding.verdict.line() if a.sharding else f"not checked: {a.sharding_unavailable}"
        print(f"  {run.out_dir.name:<9} {line}")
    print("\nStep and communication time (transfer time, mean over ranks):")
    for run, a in zip(runs, analyses):
        t = a.facts
        share = "" if t.comm_share is None else f" ({100 * t.comm_share:.0f}% of the step)"
        print(f"  {run.out_dir.name:<9} step {t.step_ms or 0:.1f} ms, communication {t.comm_ms or 0:.1f} ms{share}")
    if args.no_serve:
        print(f"\nsptrace dash {' '.join(str(r.out_dir) for r in runs)}   # to browse them")
        return 0
    from sptrace.dashboards.app import serve

    print(f"\ndashboard: http://127.0.0.1:{args.port}/  (Ctrl-C stops it)", flush=True)
    serve([r.out_dir for r in runs], port=args.port, analyses=analyses)
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag} is empty")
    return values


def sweep_config(base: StepConfig, scheme: str, seq: int) -> StepConfig:
    """The run of ``scheme`` (``-zero3`` for FSDP2) at length ``seq``: ``base`` carries USP's
    Ulysses degree, which every other scheme records as 1, as ``sptrace profile`` does."""
    name = scheme.removesuffix("-zero3")
    degree = base.ulysses_degree if name == "usp" else 1
    return base.replace(scheme=name, zero3=scheme.endswith("-zero3"), seq=seq, ulysses_degree=degree)


def run_sweep(
    base: StepConfig,
    schemes: list[str],
    seqs: list[int],
    out: Path,
    *,
    warmup: int,
    device: str,
    force: bool,
    log: Any,
    steps: int = 2,
) -> tuple[pd.DataFrame, Fit | None]:
    """Profile each combination (skipping runs already complete unless ``force``) in one launch,
    then analyse every run of ``out`` and tabulate them (sptrace.sweep.summarize)."""
    from sptrace.analysis import analyse_run
    from sptrace.launch import RunRequest, holds_run, profile_references
    from sptrace.sweep import run_name, summarize, sweep_runs

    combos = [sweep_config(base, s, n) for s in schemes for n in seqs]
    out.mkdir(parents=True, exist_ok=True)
    todo = []
    for cfg in combos:
        target = out / run_name(cfg.scheme + ("-zero3" if cfg.zero3 else ""), cfg.seq)
        if force or not (target.is_dir() and holds_run(target) and (target / "run.json").is_file()):
            todo.append(RunRequest(cfg, target))
        else:
            log(f"{target.name}: already profiled")
    if todo:
        log(f"sweep: profiling {len(todo)} of {len(combos)} runs in one launch")
        for run in profile_references(todo, warmup=warmup, steps=steps, device=device, force=True, log=None):
            log(f"{run.out_dir.name}: done")
    return summarize(out, (analyse_run(p) for p in sweep_runs(out)))  # one analysis held at a time


def cmd_sweep(args: argparse.Namespace) -> int:
    """Profile every scheme x sequence length, then the comparison table and the regression."""
    from sptrace.sweep import FIT, TABLE, UNDERDETERMINED

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    for s in schemes:
        if s not in SCHEME_CHOICES:
            raise UsageError(f"--schemes: unknown scheme {s!r}; choose from {', '.join(SCHEME_CHOICES)}")
    seqs = _int_list(args.seqs, "--seq")
    args.seq = seqs[0]
    if args.config:
        _apply_config(args, SWEPT_BY_CONFIG)
    base = _config_from(args, "megatron", args.nproc)
    base = base.replace(ulysses_degree=_ulysses_degree(args, "usp", args.nproc))  # (only usp reads it)
    for s in schemes:  # every combination is checked before anything is launched
        for n in seqs:
            sweep_config(base, s, n)
    out = Path(args.out)
    table, fit = run_sweep(
        base, schemes, seqs, out, warmup=args.warmup, device=args.device, force=args.force, log=log, steps=args.steps
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if fit:
        c = fit["coefficients"]
        terms = " + ".join(f"{v:.4g}*{k}" for k, v in c.items() if k != "intercept")
        r2 = "n/a" if fit["r2"] is None else f"{fit['r2']:.4f}"
        print(f"\nfit over {fit['runs']} runs: time_ms = {c['intercept']:.4g} + {terms}  (R^2 {r2})")
        if fit["underdetermined"]:
            print(f"note: {UNDERDETERMINED}")
    print(f"\nwrote {out / TABLE} and {out / FIT}; sptrace dash {out} opens the Compare page")
    return 0
