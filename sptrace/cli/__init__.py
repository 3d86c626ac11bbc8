"""The ``sptrace`` command: a package of thin subcommands over one analysis (sptrace.analysis).
Errors are raised as ``SptraceError`` and turned into one line and an exit code here, once."""

from __future__ import annotations

import os
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
    for name in ("path", "base", "new", "baseline"):
        path = getattr(args, name, None)
        if isinstance(path, str) and not os.path.exists(path):
            raise TraceError(path, "no such file or directory")


READS_AHEAD = ("info", "analyze", "check", "collectives", "export", "whatif")
"""The commands whose first work is to map the run at their PATH, here, one rank after another:
its first rank is read ahead (``_read_ahead``)."""


def _read_ahead(args) -> None:
    """The run's first rank decoded on a thread while the command imports numpy, pyarrow and
    pandas (sptrace.load.native), where it will be decoded here: the map runs in this process,
    and the cache holds nothing of that rank (else it may answer, and the reading is wasted)."""
    if args.command not in READS_AHEAD or args.executor != "local":
        return
    from pathlib import Path

    from sptrace.load.files import RunFiles

    try:
        files = RunFiles.scan(args.path).files
    except SptraceError:
        return  # (the command says it, as it would have)
    if not files:
        return
    if not args.no_cache:
        from sptrace.cachedir import default_cache_dir, trace_prefix

        directory = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
        if next(directory.glob(trace_prefix(files[0]) + "*"), None) is not None:
            return
    from sptrace.load.native import read_ahead

    read_ahead(files[0])


def command() -> None:
    """The ``sptrace`` executable (and ``python -m sptrace``): ``main`` on the command line, and
    the process ends with the command (``_leave``)."""
    code = main()
    _leave(code)
    sys.exit(code)


def _leave(code: int) -> None:
    """End the command's own process once its work is done and said: the output flushed and the
    atexit handlers run (worker pools, a read-ahead), but not the interpreter's teardown, which
    frees numpy's, pyarrow's and pandas' modules object by object (30-50 ms, a tenth to a sixth of
    a small command: docs/performance.md). A thread that the process would wait for keeps the
    ordinary exit."""
    import atexit
    import threading

    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # (the reader left; a stream closed by the command)
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """A command's exit code: the command line's (``argv`` None) or the one given, in-process."""
    common.CLI_PROCESS = argv is None  # (the command line's own process: sptrace.cli.common.analysis_imports)
    if argv is None:
        # sptrace multiplies no matrices: OpenBLAS's threads, which numpy starts one a core as it
        # is imported and which spin a while, only cost CPU (a third of `sptrace info`'s on 2
        # cores). The user's own setting wins; worker processes and reference ranks inherit it.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
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
        _read_ahead(args)
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
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if "sptrace.load.native" in sys.modules:  # (a read-ahead nobody took: the command went on without it)
            sys.modules["sptrace.load.native"].drop_read_ahead()


__all__ = ["build_parser", "command", "main"]
