"""``sptrace info``: ranks, world size, groups, events, and which analyses the traces allow."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sptrace.cli.common import add_load_flags, load_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what a run's traces hold and which analyses they allow")
    p.add_argument("path", help="a run directory (per-rank *.json / *.json.gz traces) or one trace file")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_load_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.load import describe
    from sptrace.rankmap import MapSpec, map_run

    options = load_options(args)
    spec = MapSpec((), cache=options["cache"], cache_dir=options["cache_dir"] and Path(options["cache_dir"]))
    run_, results = map_run(args.path, spec, skip_bad=options["skip_bad"], executor=options["executor"])
    info = describe.describe_run(run_, {rank: r.description for rank, r in results.items()})
    print(json.dumps(info, indent=2) if args.format == "json" else describe.render_text(info))
    return 0
