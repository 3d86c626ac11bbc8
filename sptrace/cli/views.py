"""``sptrace report`` (a self-contained HTML file) and ``sptrace dash`` (the dashboard), both
over the runs named on the command line and nothing else, analysed with the same model flags,
--config and load flags as ``check`` and ``analyze`` (each applies to every run named)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sptrace.cli.common import add_at_flag, add_load_flags, add_shape_flags, declarations, load_options, log
from sptrace.vocab.errors import UsageError
from sptrace.vocab.units import count

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dash", help="serve the dashboard over one or several runs (127.0.0.1 by default)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories, trace files or sweep folders")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8050)
    p.add_argument("--debug", action="store_true", help="Dash debug mode (loopback only; never on unless asked)")
    add_shape_flags(p)
    add_at_flag(p)
    add_load_flags(p)
    p.set_defaults(func=cmd_dash)

    p = sub.add_parser("report", help="a self-contained HTML report over one or several runs")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories or trace files")
    p.add_argument("--html", required=True, help="the HTML file to write (atomically)")
    add_shape_flags(p)
    add_at_flag(p)
    add_load_flags(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Exit 0 with the report written; 2 when no run could be analysed (nothing is written)."""
    from sptrace.analysis import RunAnalysis, try_analyse
    from sptrace.fileio import write_atomic
    from sptrace.report.html import render_html

    paths = [Path(p) for p in args.paths]
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory")
    flags, options = declarations(args), load_options(args)
    runs = [(p, try_analyse(p, flags=flags, load_options=options)) for p in paths]  # the renderer only renders
    usable = sum(isinstance(a, RunAnalysis) for _, a in runs)
    if not usable:
        raise UsageError(f"no run could be analysed among {', '.join(map(str, paths))}; {args.html} not written")
    text = render_html(runs)
    write_atomic(Path(args.html), text.encode())
    log(f"wrote {args.html} ({len(text) / 2**20:.1f} MiB, {usable} of {count(len(paths), 'run')} analysed)")
    return 0


def cmd_dash(args: argparse.Namespace) -> int:
    """Serve the Dash dashboard over the runs named here (and only those)."""
    from sptrace.dashboards.app import serve
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
    options = {"flags": declarations(args), "load_options": load_options(args)}
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a TCP port")
    if args.host not in LOOPBACK:
        if args.debug:
            raise UsageError(f"--debug serves an interactive debugger: only on loopback, not on {args.host}")
        log(f"warning: serving on {args.host}: anyone who reaches this machine can read these runs")
    log(f"dashboard on http://{args.host}:{args.port}/ over {len(paths)} runs (Ctrl-C stops it)")
    serve(paths, host=args.host, port=args.port, debug=args.debug, sweeps=sweeps, options=options)
    return 0
