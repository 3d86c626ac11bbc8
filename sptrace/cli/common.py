"""What every subcommand shares: one-line logging, the model and load flags, run loading."""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from typing import Any

from sptrace.dtypes import ACTIVATION_DTYPES
from sptrace.errors import UsageError
from sptrace.shape import RECOMPUTE, SCHEME_CHOICES


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: bad flags become one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def log(msg: str) -> None:
    print(f"sptrace: {msg}", file=sys.stderr, flush=True)


SHAPE_FLAGS = ("layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn")


def add_shape_flags(p: argparse.ArgumentParser, *, scheme: bool = True, names: tuple[str, ...] = SHAPE_FLAGS) -> None:
    """What the user declares about a run they analyse; every value defaults to run.json's,
    and is unknown when neither says (never a reference model's default)."""
    g = p.add_argument_group("the run's model (default: run.json's; unknown when neither says)")
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


def shape_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The ModelShape fields the user passed (None: not passed)."""
    values = {name: getattr(args, name, None) for name in SHAPE_FLAGS}
    values["sp_size"] = getattr(args, "sp", None)
    values["dtype"] = getattr(args, "dtype", None)
    values["scheme"] = getattr(args, "scheme", None)
    values["recompute"] = getattr(args, "recompute", None)
    values["grad_bucket_mib"] = getattr(args, "grad_bucket_mib", None)
    return values


def add_load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-cache", action="store_true", help="parse the traces again; do not read or write the cache")
    p.add_argument("--cache-dir", help="where parsed tables are cached (default: $XDG_CACHE_HOME/sptrace)")
    p.add_argument("--skip-bad", action="store_true", help="warn about unusable rank files and analyse the rest")
    p.add_argument(
        "--workers", type=int, help="processes that parse ranks in parallel (default: one per core for large runs)"
    )


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"cache": not args.no_cache, "skip_bad": args.skip_bad, "cache_dir": args.cache_dir, "workers": args.workers}


def load_quietly(args: argparse.Namespace):
    """load_run with the CLI's flags; its warnings go to stderr, one line each."""
    from sptrace.load import load_run

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = load_run(args.path, **load_options(args))
    for w in seen:
        log(f"warning: {w.message}")
    return run


def analyse(args: argparse.Namespace, **options: Any):
    """The run's analysis (sptrace.analysis) with the flags the user passed; the loader's
    warnings go to stderr, one line each."""
    from sptrace.analysis import analyse_run

    analysis = analyse_run(args.path, flags=shape_flags(args), load_options=load_options(args), **options)
    for w in analysis.warnings:
        log(f"warning: {w}")
    return analysis


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def size_text(value: Any) -> str:
    from sptrace.units import human_bytes

    return "?" if missing(value) else human_bytes(float(value))
