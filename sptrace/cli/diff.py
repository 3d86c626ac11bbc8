"""``sptrace diff BASE NEW``: what a change did to communication, retained memory and time. Exit 0
no regression, 1 a regression (a new full-size save, more wire bytes, a slower step), 2 cannot
compare."""

from __future__ import annotations

import argparse
import json

from sptrace.cli.common import add_load_flags, add_shape_flags, declarations, emit, load_options, log
from sptrace.vocab.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changed from one run to another (exit 1 on a regression)")
    p.add_argument("base", help="the baseline: a run directory or one trace file")
    p.add_argument("new", help="the run to compare with it")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                   help="text (the largest changes first), JSON, or Markdown (a pull-request comment)")  # fmt: skip
    p.add_argument("--bytes-tolerance", type=float, default=0.0, metavar="FRACTION",
                   help="more wire bytes a step than this fraction over the baseline is a regression "
                   "(default 0)")  # fmt: skip
    p.add_argument("--time-tolerance", type=float, default=0.05, metavar="FRACTION",
                   help="a step slower by more than this fraction (and outside both runs' spread across ranks) is a "
                   "regression (default 0.05)")  # fmt: skip
    p.add_argument("--output", help="write the report here (atomically) instead of stdout")
    add_shape_flags(p)  # (of both runs: each run's own run.json first, then these)
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.diff import diff_runs
    from sptrace.report.diff import render_markdown, render_text

    for name in ("bytes_tolerance", "time_tolerance"):
        if not getattr(args, name) >= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, not {getattr(args, name)}")
    d = diff_runs(*_analyses(args, args.base, args.new, declarations(args)), bytes_tolerance=args.bytes_tolerance,
                  time_tolerance=args.time_tolerance)  # fmt: skip
    if args.format == "json":
        text = json.dumps(d.to_dict(), indent=1, default=str) + "\n"
    elif args.format == "markdown":
        text = render_markdown(d)
    else:
        text = render_text(d)
    emit(args, text)
    return d.exit_code


def _analyses(args: argparse.Namespace, base: str, new: str, flags=None, parts=("collectives", "sharding", "modules")):
    """Both runs' analyses, each with its own run.json and ``flags`` (what the user declared, of
    both: a baseline is the same job); the loader's warnings on stderr, each naming its run.
    ``parts``: the diff's (modules: each module's own time), the baseline gate's fewer."""
    from sptrace.analysis import analyse_run

    options = load_options(args)
    out = []
    for path in (base, new):
        a = analyse_run(path, flags=flags, parts=parts, load_options=options)
        for w in a.warnings:
            log(f"warning: {path}: {w}")
        out.append(a)
    return out


def add_baseline_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", metavar="BASE", help="judge the run against this run instead: fail on a module "
                   "keeping a full-size tensor BASE did not keep, or sending more bytes than BASE (JUnit: a case per "
                   "module)")  # fmt: skip


def run_baseline(args: argparse.Namespace, fmt: str) -> int:
    """``check``/``analyze RUN --baseline BASE``: the run against its baseline, per module."""
    import time

    from sptrace.baseline import baseline_gate
    from sptrace.diff import diff_runs

    clock = time.perf_counter()
    base, run_ = _analyses(args, args.baseline, args.path, declarations(args), parts=("collectives", "sharding"))
    gate = baseline_gate(diff_runs(base, run_))
    if fmt == "json":
        text = json.dumps(gate.to_dict(), indent=1, default=str) + "\n"
    elif fmt == "junit":
        from sptrace.report.junit import render_baseline_junit

        text = render_baseline_junit(gate, seconds=time.perf_counter() - clock)
    else:
        lines = [f"{args.path} against the baseline {args.baseline}"]
        lines += [f"the job changed: {f} {a} -> {b}" for f, a, b in gate.diff.shape_changes]
        lines += [f"FAIL {c.module}: {'; '.join(c.failures)}" for c in gate.failed]
        lines += [f"note: {n}" for n in gate.diff.notes]
        lines.append(gate.line())
        text = "\n".join(lines) + "\n"
    emit(args, text, gate.line())
    return gate.exit_code
