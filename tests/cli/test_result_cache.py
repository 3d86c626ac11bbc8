"""GIVEN a run that the `sptrace` command has read once (collectives, analyze, info)
WHEN the same command is run again: unchanged, after a trace is touched, run.json edited or a
file added, with another flag or environment, with its entry damaged, with --no-cache, or as
`check`
THEN an unchanged run's result is printed again without pandas being imported (same stdout,
stderr and exit code as computed), every change computes afresh, nothing damaged is trusted, the
gate always judges, and `sptrace cache info` / `clear` count and empty the results.

Each call is a fresh `sptrace` process (a replay is the command's own, never an in-process
main([...]), where code may be patched); the driver reports whether pandas was imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sptrace.cli import main
from tests.trace_helpers import write_gpu_run

# the `sptrace` command, and on stderr's last line whether this process imported pandas
DRIVER = ("import sys; from sptrace.cli import main; sys.argv[0] = 'sptrace'; code = main(); "
          "sys.stderr.write('\\nPANDAS=%s' % ('pandas' in sys.modules)); sys.exit(code)")  # fmt: skip


def sptrace(*argv: str, cache: Path, env: dict[str, str] | None = None) -> tuple[int, str, str, bool]:
    """(exit code, stdout, stderr, whether pandas was imported) of a fresh `sptrace` process."""
    environ = {**os.environ, "XDG_CACHE_HOME": str(cache), **(env or {})}
    done = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, env=environ,
                          timeout=120)  # fmt: skip
    err, _, flag = done.stderr.rpartition("\nPANDAS=")
    return done.returncode, done.stdout, err, flag.strip() == "True"


def results(cache: Path) -> list[Path]:
    return sorted((cache / "sptrace" / "results").glob("*.result"))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = write_gpu_run(tmp_path / "run", world=3)
    (root / "rank2.json").unlink()  # a missing rank: a warning on stderr, which is replayed too
    return root


def test_a_repeated_command_is_replayed_and_every_change_computes_afresh(tmp_path, run):
    cache = tmp_path / "xdg"
    first = sptrace("analyze", str(run), cache=cache)
    code, out, err, pandas = first
    assert pandas and code == 0 and "1 of 3 ranks has no trace" in err and "compared with each other" in out
    assert len(results(cache)) == 1

    # THEN the same command on the unchanged run prints the same, and imports no pandas
    assert sptrace("analyze", str(run), cache=cache) == (code, out, err, False)

    # a touched trace, another flag, an SPTRACE_ variable: computed again (the same run, the same answer)
    os.utime(run / "rank0.json", ns=(1, 1))
    assert sptrace("analyze", str(run), cache=cache) == (code, out, err, True)
    assert len(results(cache)) == 1  # the older version of the same command's result is gone
    as_json = sptrace("analyze", str(run), "--format", "json", cache=cache)
    assert as_json[3] and json.loads(as_json[1])["verdict"]
    assert sptrace("analyze", str(run), cache=cache, env={"SPTRACE_ANY": "1"})[3]

    # a run.json that declares the model: the analysis changes, and so does what is printed
    (run / "run.json").write_text(json.dumps({"config": {"scheme": "megatron", "sp_size": 2}}))
    declared = sptrace("analyze", str(run), cache=cache)
    assert declared[3] and declared[1] != out and "--scheme" not in declared[1]
    assert sptrace("analyze", str(run), cache=cache)[1:] == (*declared[1:3], False)

    # a file added to the folder
    (run / "notes.txt").write_text("x")
    assert sptrace("analyze", str(run), cache=cache)[3]


def test_a_damaged_result_is_never_trusted(tmp_path, run):
    cache = tmp_path / "xdg"
    code, out, err, _ = sptrace("collectives", str(run), cache=cache)
    (entry,) = results(cache)
    entry.write_bytes(entry.read_bytes().replace(b"all_reduce", b"ALL_REDUCE"))  # the CRC in its name no longer fits
    assert sptrace("collectives", str(run), cache=cache) == (code, out, err, True)
    (rebuilt,) = results(cache)  # the damaged entry deleted, the result kept again as computed
    assert b"ALL_REDUCE" not in rebuilt.read_bytes() and b"all_reduce" in rebuilt.read_bytes()
    assert sptrace("collectives", str(run), cache=cache) == (code, out, err, False)


def test_the_gate_and_uncached_commands_always_compute(tmp_path, run):
    cache = tmp_path / "xdg"
    for _ in range(2):
        assert sptrace("check", str(run), "--batch", "1", "--seq", "8", "--hidden", "8", cache=cache)[3]
        assert sptrace("collectives", str(run), "--no-cache", cache=cache)[3]
    assert results(cache) == []
    # in-process calls (tests, notebooks: code may be patched) neither replay nor keep
    assert main(["collectives", str(run), "--cache-dir", str(tmp_path / "store")]) == 0
    assert not (tmp_path / "store" / "results").exists()


def test_cache_info_and_clear_count_the_results(tmp_path, run, capsys):
    cache = tmp_path / "xdg"
    sptrace("info", str(run), cache=cache)
    sptrace("collectives", str(run), "--format", "csv", cache=cache)
    assert main(["cache", "info", "--cache-dir", str(cache / "sptrace"), "--format", "json"]) == 0
    held = json.loads(capsys.readouterr().out)["results"]
    assert held["entries"] == 2 and held["bytes"] == sum(p.stat().st_size for p in results(cache))
    assert sorted(c.split()[0] for c in held["commands"]) == ["collectives", "info"]
    assert main(["cache", "info", "--cache-dir", str(cache / "sptrace")]) == 0
    assert "2 results" in capsys.readouterr().out
    assert main(["cache", "clear", "--cache-dir", str(cache / "sptrace")]) == 0
    assert results(cache) == [] and not list((cache / "sptrace").iterdir())


def test_a_missing_path_is_said_before_anything_is_imported(tmp_path):
    code, out, err, pandas = sptrace("collectives", str(tmp_path / "nothing"), cache=tmp_path / "xdg")
    assert (code, out, pandas) == (2, "", False)
    assert err.strip() == f"sptrace: error: {tmp_path / 'nothing'}: no such file or directory"


def test_analyze_against_a_baseline_is_keyed_by_the_baselines_files_too(tmp_path):
    """`analyze RUN --baseline BASE` prints what BASE holds as much as RUN: a touched baseline trace
    is another key, so its kept result is never printed again for a changed baseline."""
    import shutil

    from sptrace.cli import build_parser, result_cache
    from tests.golden.make_golden import reference_runs

    runs = reference_runs()
    base = tmp_path / "base"
    shutil.copytree(runs["megatron"], base)
    args = build_parser().parse_args(["analyze", str(runs["megatron-stray-full-save"]), "--baseline", str(base)])
    before = result_cache.key_of(args)
    assert before is not None
    trace = next(base.glob("rank0*"))
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    assert result_cache.key_of(args) != before
