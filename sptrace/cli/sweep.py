"""``sptrace sweep``: profile schemes x sequence lengths with the reference models, then the
comparison table and the regression over it (sptrace.sweep)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sptrace.cli.common import log
from sptrace.cli.reference_flags import config_from, ulysses_degree_of
from sptrace.reference_models.config import StepConfig
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import SCHEME_CHOICES

if TYPE_CHECKING:  # pandas is imported when a sweep is tabulated, not to parse flags
    import pandas as pd

    from sptrace.sweep import Fit


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
    log: Callable[[str], None],
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
    base = config_from(args, "megatron", args.nproc)
    base = base.replace(ulysses_degree=ulysses_degree_of(args, "usp", args.nproc))  # (only usp reads it)
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
