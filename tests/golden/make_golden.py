"""Write the golden set: the JSON of `sptrace info`, `collectives`, `analyze` and `check` for every
run below, as tests/golden/test_golden.py compares it.

    python -m tests.golden.make_golden [--corpus DIR]

- ``reference.json.gz``: the runs committed under tests/golden/runs/ (2 ranks each, profiled once
  with ``sptrace profile --matrix``; see RUNS_MATRIX);
- ``corpus.json.gz``: the real-trace corpus (tests.suite.CORPUS, or --corpus DIR), read in place:
  each folder of several rank traces as one run, each trace alone in its folder as a run of its own.

Run it only when a change of output is intended, and say why in the commit. Its files are
gzip-compressed JSON with sorted keys and a zero gzip mtime: unchanged code writes identical bytes."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from tests.golden.outputs import outputs
from tests.suite import CORPUS

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
REFERENCE_FILE = HERE / "reference.json.gz"
CORPUS_FILE = HERE / "corpus.json.gz"

RUNS_MATRIX = {
    "defaults": {"nproc": 2, "lean": True, "layers": 1, "batch": 2, "seq": 32, "hidden": 48, "heads": 4,
                 "kv_heads": 4, "ffn": 64},
    "runs": {
        "megatron": {"scheme": "megatron"},
        "ulysses": {"scheme": "ulysses"},
        "hybrid": {"scheme": "hybrid"},
        "ring": {"scheme": "ring", "kv_heads": 2},  # GQA
        # g = a at P = 2: the K/V block a rank keeps, [2, B, S/P, g, d], holds exactly B*S*H
        # elements and its leading 2 reads as P chunks; once judged full (a false FAIL)
        "ring-mha": {"scheme": "ring"},
        "usp": {"scheme": "usp"},
        "megatron-stray-full-save": {"scheme": "megatron", "fault": "stray-full-save"},
    },
}  # fmt: skip
"""How tests/golden/runs/ was profiled (`sptrace profile --matrix FILE --out DIR --warmup 1`, then
each run's rank*.pt.trace.json.gz and run.json copied; its logs/ left out). Lean (no Python stacks):
a run with them is twice the size."""

TRACE_SUFFIXES = (".json", ".json.gz")


def reference_runs() -> dict[str, Path]:
    """name -> folder of the committed reference runs."""
    return {p.name: p for p in sorted(RUNS.iterdir()) if p.is_dir()}


def corpus_runs(corpus: Path) -> dict[str, Path]:
    """name (the path from the corpus root) -> run: a folder that holds several traces is a run,
    a trace alone in its folder is a run by itself."""
    traces = sorted(p for p in corpus.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    folders: dict[Path, list[Path]] = {}
    for path in traces:
        folders.setdefault(path.parent, []).append(path)
    runs: dict[str, Path] = {}
    for folder, files in folders.items():
        for run in [folder] if len(files) > 1 else files:
            runs[run.relative_to(corpus).as_posix()] = run
    return dict(sorted(runs.items()))


def record(runs: dict[str, Path]) -> dict[str, Any]:
    return {name: outputs(path) for name, path in runs.items()}


def encode(golden: dict[str, Any]) -> bytes:
    """The stored bytes: sorted keys, a newline per item (readable with zcat), gzip with mtime 0."""
    text = json.dumps(golden, sort_keys=True, indent=1) + "\n"
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def load(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden.make_golden", description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help=f"the real-trace corpus (default {CORPUS})")
    args = parser.parse_args(argv)
    if not args.corpus.is_dir():
        parser.error(f"no corpus at {args.corpus}: pass --corpus DIR (the stored corpus outputs need every run)")
    for path, runs in ((REFERENCE_FILE, reference_runs()), (CORPUS_FILE, corpus_runs(args.corpus))):
        data = encode(record(runs))
        path.write_bytes(data)
        print(f"wrote {path.relative_to(HERE.parent.parent)}: {len(runs)} runs, {len(data):,} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
