"""GIVEN an 8-rank reference run (clean and with a stray full-size save) and a damaged copy
WHEN it is analysed with each executor: this process, two local worker processes, a Dask
LocalCluster, and a Dask scheduler given by address
THEN every executor gives the same collectives, timing, retained tensors and verdicts; the
driver holds no event table (every rank's trace is released after the map) yet can read one
again on demand; a bad rank file or a wrong executor flag is one line and exit 2."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from sptrace.analysis import analyse_run
from sptrace.cli import main
from sptrace.run.executors import Executor

pytestmark = pytest.mark.distributed
dask_distributed = pytest.importorskip("dask.distributed", reason="the dask extra is not installed")


@pytest.fixture(scope="module")
def scheduler():
    """A Dask cluster that the CLI reaches by its address, as a user's would be."""
    cluster = dask_distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    yield cluster.scheduler_address
    cluster.close()


def fingerprint(a) -> dict:
    """What an analysis concluded, independent of the order results arrived in."""
    colls = a.collectives.drop(columns=["source"], errors="ignore")
    colls = colls.sort_values(["rank", "seq"] if "seq" in colls else ["rank", "start_us"]).reset_index(drop=True)
    retained = pd.concat([r.tensors.assign(rank=r.rank) for r in a.retained], ignore_index=True) if a.retained else None
    return {
        "collectives": colls,
        "timing": sorted((t.rank, t.step_ms, t.comm_ms, t.exposed_ms, t.issue_only) for t in a.timing),
        "retained": retained,
        "verdicts": (a.collectives_verdict and a.collectives_verdict.line(), a.sharding and a.sharding.verdict.line()),
        "classes": a.sharding.counts() if a.sharding else None,
        "phases": a.phases.sort_values(["rank", "start_us"]).reset_index(drop=True),
        "memory": a.memory.sort_values(["rank", "ts_us"]).reset_index(drop=True),
        "peaks": a.peak_allocated,
        "ranks": sorted(a.run.ranks),
    }


def same(x: dict, y: dict) -> None:
    for key in x:
        if isinstance(x[key], pd.DataFrame):
            pd.testing.assert_frame_equal(x[key], y[key], check_dtype=False, obj=key)
        else:
            assert x[key] == y[key], key


@pytest.mark.parametrize("name", ["megatron", "megatron-stray-full-save"])
def test_every_executor_gives_the_same_analysis(profiled, private_cache, cache_dir, scheduler, name):
    """The suite's cache serves two executors; the worker processes and the Dask workers each
    decode the traces themselves (no cache, and a cold one they write)."""
    run = profiled(name)
    results = {}
    for label, executor, options in (
        ("in-process", Executor(workers=1), {"cache_dir": private_cache}),
        ("processes", Executor(workers=2), {"cache": False}),
        ("dask-local", Executor("dask", workers=2), {"cache_dir": cache_dir}),
        ("dask-scheduler", Executor("dask", scheduler=scheduler), {"cache_dir": private_cache}),
    ):
        a = analyse_run(run, load_options={"executor": executor, **options})
        assert a.sharding is not None and len(a.retained) == 8 and len(a.collectives) > 0, label
        # the driver holds no event table once the map is done ...
        assert all(t.loaded is None for t in a.run), label
        results[label] = fingerprint(a)
    for label in ("processes", "dask-local", "dask-scheduler"):
        same(results["in-process"], results[label])
    assert results["in-process"]["classes"]["full"] == (8 if "stray" in name else 0)
    # ... and reads one again on demand, identical to a fresh load
    trace = a.run.ranks[3]
    assert trace.table.num_rows == trace.num_events > 0 and trace.rank == 3


def test_cli_with_a_dask_scheduler_prints_what_the_local_executor_prints(profiled, capsys, scheduler):
    run = str(profiled("ulysses"))  # (through the suite's cache, which the test process set for the workers too)
    assert main(["analyze", run]) == 0
    local = capsys.readouterr().out
    assert main(["analyze", run, "--executor", "dask", "--scheduler", scheduler]) == 0
    assert capsys.readouterr().out == local and "MATCH" in local
    assert main(["info", run, "--executor", "dask", "--scheduler", scheduler]) == 0
    assert "0-7 of world size 8" in capsys.readouterr().out


def test_bad_input_and_wrong_flags_are_one_line(profiled, capsys, tmp_path, scheduler):
    broken = tmp_path / "broken"
    shutil.copytree(profiled("megatron"), broken, ignore=shutil.ignore_patterns("logs"))
    victim = sorted(broken.glob("*.json*"))[2]
    victim.write_bytes(victim.read_bytes()[:1000])
    for flags in (["--executor", "dask", "--scheduler", scheduler], ["--workers", "2"]):
        assert main(["collectives", str(broken), "--no-cache", *flags]) == 2
        err = capsys.readouterr().err
        assert victim.name in err and "Traceback" not in err and err.count("\n") == 1, err
    # --skip-bad analyses the other seven on the cluster too
    assert main(["info", str(broken), "--no-cache", "--skip-bad", "--executor", "dask", "--scheduler", scheduler]) == 0
    out = capsys.readouterr().out
    assert f"skipped: {victim}" in out
    for flags in (["--scheduler", scheduler], ["--workers", "0"], ["--executor", "ray"]):
        assert main(["info", str(broken), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sptrace: error:") and err.count("\n") == 1, (flags, err)
