"""``sptrace info``: ranks, world size, groups, events, and which analyses the traces allow."""

from __future__ import annotations

import argparse
import json

from sptrace.cli.common import add_load_flags, map_quietly


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what a run's traces hold and which analyses they allow")
    p.add_argument("path", help="a run directory (per-rank *.json / *.json.gz traces) or one trace file")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text, or JSON")
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.load import describe

    run_, ranks = map_quietly(args, (), show_warnings=False)  # info lists them in its report
    info = describe.describe_run(run_, ranks.descriptions)
    print(json.dumps(info, indent=2) if args.format == "json" else describe.render_text(info))
    return 0
