"""``sptrace cache info`` / ``sptrace cache clear``: the parsed-table cache (sptrace.load.cache)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sptrace.units import human_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="the cache of parsed traces: what it holds, or clear it")
    p.add_argument("action", choices=("info", "clear"))
    p.add_argument("--cache-dir", help="default: $XDG_CACHE_HOME/sptrace")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text, or JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace.load import cache

    directory = Path(args.cache_dir) if args.cache_dir else cache.default_cache_dir()
    cap = cache.max_bytes()
    if args.action == "clear":
        freed = cache.clear(directory)
        print(f"{directory}: cleared, {human_bytes(freed)} freed")
        return 0
    entries = cache.entries(directory)
    total = sum(e.bytes for e in entries)
    gone = [e for e in entries if e.source_gone]
    if args.format == "json":
        print(json.dumps({
            "directory": str(directory), "entries": len(entries), "bytes": total, "max_bytes": cap,
            "source_gone": len(gone),
            "traces": [{"source": e.source, "bytes": e.bytes, "used": e.used} for e in reversed(entries)],
        }, indent=1))  # fmt: skip
        return 0
    print(f"{directory}: {len(entries)} entries, {human_bytes(total)} of at most {human_bytes(cap)} "
          f"(SPTRACE_CACHE_MAX); least recently used go first")  # fmt: skip
    if gone:
        print(f"{len(gone)} entries parsed from traces that are gone (dropped at the next write, or by clear)")
    for e in reversed(entries[-20:]):
        print(f"  {human_bytes(e.bytes):>12}  {e.source or '?'}")
    if len(entries) > 20:
        print(f"  ... and {len(entries) - 20} older entries")
    return 0
