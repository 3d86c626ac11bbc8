"""``sptrace whatif RUN [--scale WHAT=FACTOR ...] [--rank R ...] [--balance] [--no-wait]``: the step
replayed on its cross-rank dependency graph with changed costs (sptrace.whatif): the measured step,
the replay with nothing changed (its error said), the prediction and its critical path, in the
words of ``sptrace analyze``. Exit 0; 2 on bad input or flags (one line)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from sptrace.cli.common import add_load_flags, add_shape_flags, analyse, emit
from sptrace.vocab.errors import UsageError

if TYPE_CHECKING:  # the replay (pandas) is imported when the command runs, not to parse flags
    from sptrace.reduce.replay import Changes

SCALE_HELP = (
    "WHAT=FACTOR: comm (every transfer), a collective kind (all_gather, reduce_scatter, all_to_all, "
    "all_reduce, send, ...), compute (every rank's busy time), or module=PATH:FACTOR (a module and "
    "what runs inside it: layers.2.mlp); repeatable"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("whatif", help="replay the step across ranks with changed costs: what would it buy?")
    p.add_argument("path", help="a run directory or one trace file")
    p.add_argument("--scale", action="append", default=[], metavar="WHAT=FACTOR", help=SCALE_HELP)
    p.add_argument("--rank", action="append", type=int, default=[], metavar="R",
                   help="apply the scales on this rank only (repeatable)")  # fmt: skip
    p.add_argument("--balance", action="store_true",
                   help="every rank's compute per layer and phase set to the median rank's (no straggler)")  # fmt: skip
    p.add_argument("--no-wait", action="store_true",
                   help="no collective waits for its last member (the lower bound)")  # fmt: skip
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text (default), or JSON with every step and the predicted path's segments")  # fmt: skip
    p.add_argument("--output", help="write the report here (atomically) instead of stdout")
    add_shape_flags(p)
    add_load_flags(p)
    p.set_defaults(func=run)


def parse_changes(scales: list[str], ranks: list[int], balance: bool, no_wait: bool) -> Changes:
    """The flags as Changes; a malformed scale is one line naming it."""
    from sptrace.reduce.replay import Changes
    from sptrace.vocab import collective_kinds

    comm = compute = 1.0
    kinds: dict[str, float] = {}
    modules: list[tuple[str, float]] = []
    for text in scales:
        what, eq, value = text.partition("=")
        if what == "module":
            path, colon, value = value.rpartition(":")
            if not colon or not path:
                raise UsageError(f"--scale {text}: write module=PATH:FACTOR (module=layers.2.mlp:0.5)")
            modules.append((path, _factor(text, value)))
        elif not eq:
            raise UsageError(f"--scale {text}: write WHAT=FACTOR (comm=0.5, all_gather=0.5, compute=0.8)")
        elif what == "comm":
            comm = _factor(text, value)
        elif what == "compute":
            compute = _factor(text, value)
        elif what in collective_kinds.names():
            kinds[what] = _factor(text, value)
        else:
            known = ", ".join(("comm", "compute", "module", *collective_kinds.names()))
            raise UsageError(f"--scale {text}: {what!r} is none of {known}")
    return Changes(comm, kinds, compute, tuple(modules), frozenset(ranks) if ranks else None, balance, no_wait)


def _factor(text: str, value: str) -> float:
    try:
        factor = float(value)
    except ValueError:
        factor = -1.0
    if not factor >= 0 or factor == float("inf"):
        raise UsageError(f"--scale {text}: the factor must be a number >= 0")
    return factor


def run(args: argparse.Namespace) -> int:
    from sptrace.cli.analyze import render_critical_path
    from sptrace.vocab.units import significant
    from sptrace.whatif import what_if

    changes = parse_changes(args.scale, args.rank, args.balance, args.no_wait)  # bad flags before any parse
    analysis = analyse(args, parts=("collectives", "whatif"), judge=False)  # it reports no check
    if args.rank:
        absent = sorted(set(args.rank) - set(analysis.run.ranks))
        if absent:
            raise UsageError(f"--rank {absent[0]}: the run has no trace of rank {absent[0]}")
    result = what_if(analysis, changes)
    if args.format == "json":
        emit(args, json.dumps(result.to_dict(), indent=2) + "\n")
        return 0
    ms = lambda us: f"{significant(us / 1e3)} ms"  # noqa: E731
    steps = f" (the slowest of {len(result.steps)} profiled steps)" if len(result.steps) > 1 else ""
    lines = [
        f"what if: {changes.describe()}",
        f"  measured step        {ms(result.measured_us)}{steps}",
        f"  replayed, no change  {ms(result.baseline_us)}  ({result.calibration_line()})",
        f"  predicted            {ms(result.predicted_us)}  ({result.gain:+.1%} against the replay)",
    ]
    if len(result.steps) > 1:
        lines.append("  each profiled step: measured, replayed, predicted")
        lines += [f"    {s.step or 'step':<20} {ms(s.measured_us):>12} {ms(s.baseline_us):>12} {ms(s.predicted_us):>12}"
                  for s in result.steps]  # fmt: skip
    lines += render_critical_path(result.path, title="predicted critical path")
    emit(args, "\n".join(lines) + "\n")
    return 0
