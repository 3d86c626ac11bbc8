"""GIVEN the small reference runs committed under tests/golden/runs/ (every scheme on 2 ranks, and
a megatron run with a stray full-size save) and every run of the real-trace corpus
WHEN `sptrace info`, `collectives`, `analyze` and `check` print them as JSON (in this process)
THEN each prints what the golden set stored (tests/golden/*.json.gz), exit code included: the
same values, types and order, with only the run's path and the cache's normalised.

A failure names the first command whose output changed and a few of the JSON paths that differ.
If the change is intended, regenerate the golden set with `python -m tests.golden.make_golden`
and commit it with the change that explains it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.golden.make_golden import CORPUS_FILE, REFERENCE_FILE, corpus_runs, load, reference_runs
from tests.golden.outputs import COMMANDS, differences, outputs

REGENERATE = "if the change is intended: python -m tests.golden.make_golden (and commit tests/golden/*.json.gz)"
REFERENCE = load(REFERENCE_FILE)
CORPUS = load(CORPUS_FILE)


def compare(name: str, stored: dict[str, Any], new: dict[str, Any]) -> None:
    """Fail on the first command (in COMMANDS order) whose exit code or output changed."""
    for command in COMMANDS:
        if command not in stored or command not in new:
            pytest.fail(f"{name}: `{command}` is {'not stored' if command not in stored else 'no longer run'}; "
                        f"{REGENERATE}", pytrace=False)  # fmt: skip
        diff = differences(stored[command], new[command])
        if diff:
            lines = "\n  ".join(diff)
            pytest.fail(f"{name}: `sptrace {command} RUN --format json` changed (stored -> now):\n  {lines}\n"
                        f"{REGENERATE}", pytrace=False)  # fmt: skip


def test_every_reference_run_is_stored():
    assert sorted(REFERENCE) == sorted(reference_runs()), REGENERATE


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_run(name: str, cache_dir: Path):
    run = reference_runs().get(name)
    assert run is not None, f"{name} is stored but not under tests/golden/runs/; {REGENERATE}"
    compare(name, REFERENCE[name], outputs(run, cache_dir))


def test_every_corpus_trace_is_stored(corpus: Path):
    runs = corpus_runs(corpus)
    assert sorted(CORPUS) == sorted(runs), REGENERATE
    traces = {p for p in corpus.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))}
    covered = {p for run in runs.values() for p in ([run] if run.is_file() else run.iterdir())}
    assert traces <= covered


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_run(name: str, corpus: Path, cache_dir: Path):
    run = corpus / name
    assert run.exists(), f"{name} is stored but not in the corpus at {corpus}; {REGENERATE}"
    compare(name, CORPUS[name], outputs(run, cache_dir))
