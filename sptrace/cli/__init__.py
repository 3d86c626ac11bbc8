"""The ``sptrace`` command: a package of thin subcommands over one analysis (sptrace.analysis).
Errors are raised as ``SptraceError`` and turned into one line and an exit code here, once."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sptrace import __version__
from sptrace.cli import (
    analyze,
    cache,
    check,
    collectives,
    common,
    diff,
    export,
    info,
    initconfig,
    model,
    reference,
    result_cache,
    views,
    whatif,
)
from sptrace.cli.common import Parser
from sptrace.vocab.errors import SptraceError, TraceError


def build_parser() -> Parser:
    parser = Parser(prog="sptrace", description="Trace profiler and analyzer for sequence-parallel training.")
    parser.add_argument("--version", action="version", version=f"sptrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    reference.add_parsers(sub)  # profile, demo, sweep
    model.add_parser(sub)
    collectives.add_parser(sub)
    analyze.add_parser(sub)
    check.add_parser(sub)
    diff.add_parser(sub)
    export.add_parser(sub)
    whatif.add_parser(sub)
    views.add_parsers(sub)  # dash, report
    info.add_parser(sub)
    initconfig.add_parser(sub)
    cache.add_parser(sub)
    return parser


def _arrow_memory_pool() -> None:
    """jemalloc for Arrow's buffers where the build has it and the user chose no pool: a table
    built from a 50 MB trace spends about 0.15 s less system time in page faults than with
    mimalloc, pyarrow's default on Linux (benchmarks/bench_load.py, section 4)."""
    import os

    if "ARROW_DEFAULT_MEMORY_POOL" in os.environ:
        return
    import pyarrow as pa

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a build without jemalloc: keep its default
        pass


def _check_path(args) -> None:
    """A run path that is not there (the run, diff's two, a --baseline) is said at once, before
    pandas is imported."""
    import os

    for name in ("path", "base", "new", "baseline"):
        path = getattr(args, name, None)
        if isinstance(path, str) and not os.path.exists(path):
            raise TraceError(path, "no such file or directory")


def main(argv: Sequence[str] | None = None) -> int:
    common.CLI_PROCESS = argv is None  # (the command line's own process: sptrace.cli.common.analysis_imports)
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # what the user typed (sweep --config)
        _check_path(args)
        key = result_cache.key_of(args) if argv is None else None  # in-process callers may patch code
        if key is not None:
            kept = result_cache.directory(getattr(args, "cache_dir", None))
            code = result_cache.replay(kept, key)
            if code is not None:
                return code
        if getattr(args, "command", None) not in ("model", "cache"):
            _arrow_memory_pool()
        if key is None:
            return int(args.func(args))
        with result_cache.recording() as chunks:
            code = int(args.func(args))
        result_cache.keep(kept, key, args, chunks, code)
        return code
    except SptraceError as exc:
        print(f"sptrace: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("sptrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sptrace collectives RUN | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


__all__ = ["build_parser", "main"]
