"""``sptrace cache info`` / ``sptrace cache clear``: the trace cache (sptrace.load.cache): parsed tables, and
per-rank summaries (sptrace.run.summaries); the replayed results (sptrace.cli.result_cache); and the
dashboard's kept analyses (sptrace.analysis_cache)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from sptrace.vocab.units import human_bytes

if TYPE_CHECKING:
    from sptrace.cachedir import Entry


class EntryRecord(TypedDict, total=False):
    """One entry as ``sptrace cache info --format json`` lists it under ``traces``."""

    source: str | None
    kind: str
    bytes: int
    used: float
    about: str | None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="the cache of parsed traces and their summaries: what it holds, or clear it")
    p.add_argument("action", choices=("info", "clear"))
    p.add_argument("--cache-dir", help="default: $XDG_CACHE_HOME/sptrace")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text, or JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sptrace import analysis_cache
    from sptrace.cachedir import default_cache_dir, max_bytes
    from sptrace.cli import result_cache
    from sptrace.load import cache
    from sptrace.run.summaries import is_current

    directory = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    results_dir = result_cache.directory(directory)
    cap = max_bytes()
    if args.action == "clear":
        freed = cache.clear(directory) + result_cache.clear(results_dir) + analysis_cache.store(directory).clear()
        print(f"{directory}: cleared, {human_bytes(freed)} freed")
        return 0
    entries = cache.entries(directory)
    results = result_cache.entries(results_dir)
    analyses = analysis_cache.store(directory).entries()
    total = sum(e.bytes for e in entries)
    gone = [e for e in entries if e.source_gone]
    tables = [e for e in entries if e.kind == "table"]
    summaries = [e for e in entries if e.kind == "summary"]
    other_code = [e for e in summaries if not is_current(e)]
    if args.format == "json":
        print(json.dumps({
            "directory": str(directory), "entries": len(entries), "bytes": total, "max_bytes": cap,
            "source_gone": len(gone),
            "tables": {"entries": len(tables), "bytes": sum(e.bytes for e in tables)},
            "summaries": {"entries": len(summaries), "bytes": sum(e.bytes for e in summaries),
                          "other_code": len(other_code)},
            "results": {"entries": len(results), "bytes": sum(e.bytes for e in results),
                        "max_bytes": cap // result_cache.SHARE,
                        "commands": [r.header.get("command", "") for r in reversed(results)]},
            "analyses": {"entries": len(analyses), "bytes": sum(e.bytes for e in analyses),
                         "max_bytes": cap // analysis_cache.SHARE},
            "traces": [_record(e) for e in reversed(entries)],
        }, indent=1))  # fmt: skip
        return 0
    print(f"{directory}: {len(entries)} entries, {human_bytes(total)} of at most {human_bytes(cap)} "
          f"(SPTRACE_CACHE_MAX); least recently used go first")  # fmt: skip
    print(f"  {len(tables)} parsed tables, {human_bytes(sum(e.bytes for e in tables))}: a rank's events, read "
          "instead of its trace")  # fmt: skip
    print(f"  {len(summaries)} summaries, {human_bytes(sum(e.bytes for e in summaries))}: a rank's collectives, "
          "timing, retained tensors and counts, read instead of detecting them again")  # fmt: skip
    print(f"  {len(results)} results, {human_bytes(sum(e.bytes for e in results))} (at most "
          f"{human_bytes(cap // result_cache.SHARE)}): what a collectives, analyze or info printed, replayed when "
          "it is run again on the unchanged run with the same flags and code")  # fmt: skip
    print(f"  {len(analyses)} analyses, {human_bytes(sum(e.bytes for e in analyses))} (at most "
          f"{human_bytes(cap // analysis_cache.SHARE)}): a dashboard's whole analysis of a run, read back when it "
          "shows the unchanged run again")  # fmt: skip
    if other_code:
        print(f"{len(other_code)} summaries written by other sptrace code (never read by this one; dropped as the "
              "cap needs room, or by clear)")  # fmt: skip
    if gone:
        print(f"{len(gone)} entries parsed from traces that are gone (dropped at the next write, or by clear)")
    for e in reversed(entries[-20:]):
        what = "table" if e.kind == "table" else f"summary ({e.header.get('about', '?')})"
        print(f"  {human_bytes(e.bytes):>12}  {what:<34} {e.source or '?'}")
    if len(entries) > 20:
        print(f"  ... and {len(entries) - 20} older entries")
    return 0


def _record(entry: Entry) -> EntryRecord:
    out = EntryRecord(source=entry.source, kind=entry.kind, bytes=entry.bytes, used=entry.used)
    if entry.kind == "summary":
        out["about"] = entry.header.get("about")
    return out
