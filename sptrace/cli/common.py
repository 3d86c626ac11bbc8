"""What every subcommand shares: one-line logging, the model and load flags, run loading."""

from __future__ import annotations

import argparse
import gc
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sptrace.run.executors import EXECUTORS
from sptrace.vocab.dtypes import ACTIVATION_DTYPES
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import CP_BALANCE, RECOMPUTE, SCHEME_CHOICES, Declarations, ShapeValues

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from sptrace.analysis import AnalyseOptions, RunAnalysis
    from sptrace.checks.findings import Verdict
    from sptrace.checks.registry import CheckReport
    from sptrace.run import LoadOptions
    from sptrace.vocab.jsontypes import JSONObject


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: bad flags become one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def log(msg: str) -> None:
    print(f"sptrace: {msg}", file=sys.stderr, flush=True)


def emit(args: argparse.Namespace, text: str, summary: str | None = None) -> None:
    """A command's report: into ``--output`` (atomically; a line on stderr says so, with
    ``summary``), else on stdout."""
    if getattr(args, "output", None):
        from sptrace.fileio import write_atomic

        write_atomic(Path(args.output), text.encode())
        log(f"wrote {args.output}" + (f": {summary}" if summary else ""))
    else:
        sys.stdout.write(text)


SHAPE_FLAGS = ("layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "ulysses_degree")


def add_shape_flags(p: argparse.ArgumentParser, *, scheme: bool = True, names: tuple[str, ...] = SHAPE_FLAGS) -> None:
    """What the user declares about a run they analyse; every value defaults to run.json's,
    and is unknown when neither says (never a reference model's default)."""
    g = p.add_argument_group("the run's model (flags, then --config, then run.json; unknown when none says)")
    g.add_argument("--config", metavar="FILE", help="a YAML or JSON file of run_info keys (seq: 4096, hidden: "
                   "4096, sp_size: 8, ...; flat, or under config: as run.json holds them)")  # fmt: skip
    if scheme:
        g.add_argument("--scheme", choices=SCHEME_CHOICES)
    g.add_argument("--sp", type=int, help="P, the sequence-parallel group size (default: run.json's, else the run's "
                   "only process group)")  # fmt: skip
    for name in names:
        g.add_argument(f"--{name.replace('_', '-')}", type=int)
    g.add_argument("--dtype", choices=ACTIVATION_DTYPES, help="activation dtype")
    if scheme:
        g.add_argument("--recompute", choices=RECOMPUTE)
        g.add_argument("--grad-bucket-mib", type=float, help="gradient all-reduce bucket cap (DDP's bucket_cap_mb)")
        g.add_argument("--causal", action=argparse.BooleanOptionalAction, help="whether attention has a causal mask")
        g.add_argument("--cp-balance", choices=CP_BALANCE, help="ring and usp: the sequence layout, zigzag "
                       "(load-balanced) or none (contiguous chunks)")  # fmt: skip


def add_at_flag(p: argparse.ArgumentParser) -> None:
    """``--at``: the production shape to project the kept activation bytes to
    (sptrace.checks.projection)."""
    p.add_argument("--at", metavar="KEY=N,...", help="project the bytes kept per rank to a production shape: seq, "
                   "hidden, layers, batch, heads, kv_heads, ffn, sp, dtype (e.g. seq=131072,hidden=8192,layers=80; "
                   "also a production: block in --config or run.json's config)")  # fmt: skip


def declarations(args: argparse.Namespace) -> Declarations:
    """What the user declared: the --config file's values (read and checked now, before any
    trace is parsed), then the flags; the production shape (its production: block, then --at)."""
    layers: list[tuple[str, ShapeValues]] = []
    production: list[tuple[str, ShapeValues]] = []
    if getattr(args, "config", None):
        from sptrace.checks.production import production_block, production_values

        document = config_document(Path(args.config))
        layers.append((f"--config {args.config}", read_config(Path(args.config), document)))
        block = production_block(document)
        if block is not None:
            source = f"--config {args.config} production"
            production.append((source, production_values(block, f"{args.config}: production")))
    layers.append(("flags", shape_flags(args)))
    if getattr(args, "at", None):
        from sptrace.checks.production import parse_at

        production.append(("--at", parse_at(args.at)))
    return Declarations(tuple(layers), tuple(production))


def config_document(path: Path) -> object:
    """A config file as YAML reads it (JSON is a subset of YAML)."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not YAML or JSON ({str(exc).splitlines()[0]})") from None


def read_config(path: Path, document: object = None) -> ShapeValues:
    """A config file's ModelShape fields (YAML, which JSON is a subset of); ``document``: the file
    already read (config_document)."""
    from sptrace.vocab.shape import ModelShape, config_values

    data = config_document(path) if document is None else document
    values = config_values(data, str(path))
    try:  # its values' types and ranges, checked now
        ModelShape().override(f"--config {path}", **values)
    except (UsageError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: {exc}") from None
    return values


def shape_flags(args: argparse.Namespace) -> ShapeValues:
    """The ModelShape fields the user passed (None: not passed)."""
    values = ShapeValues(**{name: getattr(args, name, None) for name in SHAPE_FLAGS})
    values["sp_size"] = getattr(args, "sp", None)
    values["dtype"] = getattr(args, "dtype", None)
    values["scheme"] = getattr(args, "scheme", None)
    values["recompute"] = getattr(args, "recompute", None)
    values["grad_bucket_mib"] = getattr(args, "grad_bucket_mib", None)
    values["causal"] = getattr(args, "causal", None)
    values["cp_balance"] = getattr(args, "cp_balance", None)
    return values


def add_load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-cache", action="store_true", help="parse the traces again; do not read or write the cache")
    p.add_argument("--cache-dir", help="where parsed tables are cached (default: $XDG_CACHE_HOME/sptrace)")
    p.add_argument("--skip-bad", action="store_true", help="warn about unusable rank files and analyse the rest")
    g = p.add_argument_group("where ranks are parsed (each rank summarized where it is parsed)")
    g.add_argument(
        "--workers",
        type=int,
        help="processes mapping ranks, this one among them (default: one per core for runs over 32 MB, else this one)",
    )
    g.add_argument(
        "--executor", choices=EXECUTORS, default="local",
        help="local processes, or dask (dask.distributed; pip install 'sptrace[dask]')",
    )  # fmt: skip
    g.add_argument(
        "--scheduler", metavar="tcp://HOST:PORT",
        help="a running Dask scheduler whose workers see the traces' filesystem (default with --executor dask: "
        "a LocalCluster of --workers processes)",
    )  # fmt: skip


def load_options(args: argparse.Namespace) -> LoadOptions:
    """The loader's options from the flags, built once for the whole command."""
    from sptrace.run import LoadOptions
    from sptrace.run.executors import Executor

    executor = Executor(args.executor, args.workers, args.scheduler)
    return LoadOptions(cache=not args.no_cache, cache_dir=args.cache_dir, skip_bad=args.skip_bad, executor=executor)


def map_quietly(args: argparse.Namespace, parts: tuple[str, ...], *, show_warnings: bool = True):
    """sptrace.run.map.gather_run with the CLI's flags: (run, the ranks' results gathered:
    sptrace.run.gather); its warnings go to stderr, one line each, unless the command shows them
    itself (``sptrace info``, which also keeps the ranks' descriptions)."""
    from sptrace.run.map import MapSpec, gather_run

    options = load_options(args)
    spec = MapSpec(parts, cache=options.cache, cache_dir=options.cache_dir)
    run, results = gather_run(args.path, spec, skip_bad=options.skip_bad, executor=options.executor,
                              keep_descriptions=not parts)  # fmt: skip
    for w in run.warnings if show_warnings else ():
        log(f"warning: {w}")
    return run, results


CLI_PROCESS = False
"""Whether this process is the command line's own (sptrace.cli.main set it): not a caller of
``main`` in a process of its own, whose collector ``analysis_imports`` leaves as it is."""


@contextmanager
def analysis_imports() -> Iterator[None]:
    """Around a command's analysis imports (pandas, numpy, sptrace's detections and checks: a third
    of a second): in the command line's own process, the cyclic collector is off while they run,
    and all they made is frozen out of its reach after (gc.freeze). Modules, classes and functions
    live as long as the process and make no garbage, yet every full collection walks them: two
    such walks of 15 ms each, in a check of 8 small ranks. What the analysis makes is collected as
    ever."""
    if not CLI_PROCESS:
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.freeze()


def analyse(args: argparse.Namespace, **options: Unpack[AnalyseOptions]) -> RunAnalysis:
    """The run's analysis (sptrace.analysis) with the flags the user passed; the loader's
    warnings go to stderr, one line each."""
    with analysis_imports():
        from sptrace.analysis import analyse_run

    analysis = analyse_run(args.path, flags=declarations(args), load_options=load_options(args), **options)
    for w in analysis.warnings:
        log(f"warning: {w}")
    return analysis


def registered(analysis: RunAnalysis, gate_only: bool = False) -> list[CheckReport]:
    """The reports of the registered checks (sptrace.checks.registry) of an analysis: every one
    but the run's own two; those that gate CI with ``gate_only``."""
    from sptrace.checks.registry import COLLECTIVES, SHARDING

    return [r for name, r in analysis.reports.items()
            if name not in (COLLECTIVES, SHARDING) and (r.gate or not gate_only)]  # fmt: skip


def registered_verdicts(analysis: RunAnalysis, gate_only: bool = False) -> list[Verdict | None]:
    return [r.verdict for r in registered(analysis, gate_only)]


def registered_json(analysis: RunAnalysis, gate_only: bool = False) -> dict[str, dict[str, JSONObject]]:
    """``{"checks": {name: report}}`` for the registered checks' reports (nothing when there are none)."""
    reports = registered(analysis, gate_only)
    return {"checks": {r.name: r.to_dict() for r in reports}} if reports else {}


def registered_text(analysis: RunAnalysis, gate_only: bool = False) -> str:
    """Each registered check's findings, notes and verdict line, under its title."""
    lines: list[str] = []
    for r in registered(analysis, gate_only):
        lines += ["", f"{r.title} ({r.name}):"]
        lines += [f"  {'FAIL' if f.severity == 'error' else f.severity} {f.text()}" for f in r.findings]
        lines += [f"  note: {n}" for n in r.notes]
        lines.append(f"  {r.line()}")
    return "\n".join(lines) + ("\n" if lines else "")


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def size_text(value: float | None) -> str:
    from sptrace.vocab.units import human_bytes

    return "?" if missing(value) else human_bytes(float(value))


def fixed_width(header: list[str], rows: list[list[str]], left: set[int] = frozenset()) -> list[str]:
    """Lines of a text table whose columns are as wide as their widest cell and two spaces apart,
    so that no value runs into the next; columns in ``left`` are left-aligned (text), the others
    right-aligned (numbers). (pandas' to_string aligns every column one way.)"""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    return [line(header), *map(line, rows)]


def by_rank_set(rows: dict[int, tuple[str, ...]]) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
    """Ranks whose cells are all equal, as one row with its rank set, in the order of each set's
    first rank: 128 identical ranks are one line, a rank that differs stands out on its own."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(rows):
        groups.setdefault(rows[rank], []).append(rank)
    return [(tuple(ranks), cells) for cells, ranks in groups.items()]


def spread(values: list[float | None], digits: int = 1) -> str:
    """'612.7' for one value (or equal ones), '612.7-698.9' for a range; '' when none is known."""
    known = [v for v in values if v is not None and v == v]
    if not known:
        return ""
    lo, hi = f"{min(known):.{digits}f}", f"{max(known):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"
