"""`sptrace profile` and `sptrace demo` from the command line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sptrace import launch
from sptrace.cli import main


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--scheme", "zigzag"], "argument --scheme: invalid choice: 'zigzag'"),
        (
            ["--scheme", "usp", "--ulysses-degree", "3"],
            "--ulysses-degree 3 does not divide the sequence-parallel size 8",
        ),
        (
            ["--scheme", "megatron", "--heads", "12", "--kv-heads", "4"],
            "heads 12 is not divisible by the sequence-parallel size 8",
        ),
        (["--scheme", "megatron", "--seq", "100"], "seq 100 is not divisible by the sequence-parallel size 8"),
        (["--scheme", "ulysses", "--nproc", "3"], "seq 128 is not divisible by the sequence-parallel size 3"),
        (["--scheme", "megatron", "--zero3"], "--zero3 applies to ulysses, hybrid, ring and usp"),
        (["--scheme", "ulysses", "--fault", "missing-reduce-scatter"], "needs a tensor-parallel MLP"),
        (["--scheme", "megatron", "--fault", "oops"], "argument --fault: invalid choice: 'oops'"),
        (["--scheme", "megatron", "--layers", "x"], "argument --layers: invalid int value: 'x'"),
        (["--scheme", "megatron", "--nproc", "0"], "--nproc must be >= 1"),
        (["--scheme", "megatron", "--device", "cuda"], "--device cuda needs 8 GPUs"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2_before_launching(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    code = main(["profile", *flags, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("sptrace: error: ")
    assert message in err
    assert not out.exists()


def test_missing_out_is_a_usage_error(capsys):
    assert main(["profile", "--scheme", "megatron"]) == 2
    assert "the following arguments are required: --out" in capsys.readouterr().err


def test_existing_run_needs_force(tmp_path, capsys):
    (tmp_path / "run.json").write_text("{}")
    assert main(["profile", "--scheme", "ulysses", "--out", str(tmp_path), "--device", "cpu"]) == 2
    assert "already holds a profiled run; pass --force" in capsys.readouterr().err


def test_failed_launch_reports_the_rank_and_keeps_the_old_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    old = {"run.json": '{"old": true}', "rank0.pt.trace.json.gz": "old trace"}
    for name, text in old.items():
        (out / name).write_text(text)

    def failing_torchrun(cmd, **kwargs):
        (run,) = json.loads(Path(cmd[cmd.index("--plan") + 1]).read_text())["runs"]
        staging = Path(run["out"])
        (staging / "rank0.pt.trace.json.gz").write_text("partial")
        (staging / "logs" / "rank3.error").write_text("RuntimeError: gloo connection reset\n")
        (staging / "logs" / "rank3.traceback").write_text("Traceback ...\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(launch.subprocess, "run", failing_torchrun)
    code = main(["profile", "--scheme", "megatron", "--out", str(out), "--force", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == (
        f"sptrace: error: profiling failed on rank3: RuntimeError: gloo connection reset "
        f"(traceback: {out / 'logs' / 'rank3.traceback'})"
    )
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == old  # untouched
    assert (out / "logs" / "rank3.traceback").exists()
    assert not list(out.glob(".staging-*"))


def test_a_failed_run_of_a_shared_launch_keeps_the_runs_before_it(tmp_path, capsys, monkeypatch):
    """One launch, three runs: the second fails on rank 1. The first is written whole, the second
    and third leave their folders as they were, and the error names the failed run's rank."""
    out = tmp_path / "runs"

    def torchrun(cmd, **kwargs):
        plan = json.loads(Path(cmd[cmd.index("--plan") + 1]).read_text())
        assert [Path(r["out"]).parent.name for r in plan["runs"]] == ["megatron", "ulysses", "hybrid"]
        first, second, _ = (Path(r["out"]) for r in plan["runs"])
        for r in range(2):
            (first / f"rank{r}.pt.trace.json.gz").write_text("trace")
        (first / "run.json").write_text('{"first": true}')
        (second / "rank0.pt.trace.json.gz").write_text("partial")
        (second / "logs" / "rank1.error").write_text("RuntimeError: out of memory\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(launch.subprocess, "run", torchrun)
    flags = ["--scheme", "megatron", "--scheme", "ulysses", "--scheme", "hybrid", "--nproc", "2", "--seq", "32"]
    code = main(["profile", *flags, "--out", str(out), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == (
        f"sptrace: error: profiling failed on rank1: RuntimeError: out of memory "
        f"(traceback: {out / 'ulysses' / 'logs' / 'rank1.traceback'}); 1 of 3 runs were written"
    )
    assert sorted(p.name for p in (out / "megatron").iterdir()) == ["logs", "rank0.pt.trace.json.gz",
                                                                     "rank1.pt.trace.json.gz", "run.json"]  # fmt: skip
    assert sorted(p.name for p in (out / "ulysses").iterdir()) == ["logs"]  # its error, no partial trace
    assert not (out / "hybrid").exists()  # never started: its folder, made for the launch, is gone
    assert not list(out.glob("*/.staging-*"))


def _matrix(tmp_path, data) -> str:
    path = tmp_path / "matrix.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    "data, message",
    [
        ("{not json", "not JSON"),
        ({"runs": {}}, "with at least one run"),
        ({"runs": {"a": {"scheme": "megatron"}}, "extra": 1}, "unknown key 'extra'"),
        ({"runs": {"a/b": {"scheme": "megatron"}}}, "a run's name is a folder name"),
        ({"runs": {"a": {"fault": "stray-full-save"}}}, "run 'a': no scheme"),
        ({"runs": {"a": {"scheme": "megatron", "colour": "red"}}}, "run 'a': unknown key 'colour'"),
        ({"runs": {"a": {"scheme": "megatron", "seq": 100}}}, "run 'a': seq 100 is not divisible"),
        ({"runs": {"a": {"scheme": "megatron", "nproc": 0}}}, "run 'a': nproc must be an integer >= 1"),
        ({"runs": {"a": {"scheme": "megatron", "lean": "yes"}}}, "run 'a': lean must be true or false"),
        ({"runs": {"a": {"scheme": "megatron", "layers": "2"}}}, "run 'a': layers must be int, got '2'"),
        ({"runs": {"a": {"scheme": "megatron", "zero3": 1}}}, "run 'a': zero3 must be bool, got 1"),
        ({"runs": {"a": {"scheme": "megatron"}, "b": {"scheme": "ulysses", "zero3": True, "nproc": 3}}},
         "run 'b': seq 128 is not divisible by the sequence-parallel size 3"),
        ({"runs": {"a": {"scheme": "megatron", "lean": True, "instrument": False}}},
         "--lean needs the instrumentation"),
    ],
)  # fmt: skip
def test_bad_matrix_is_one_line_before_anything_launches(tmp_path, capsys, monkeypatch, data, message):
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    out = tmp_path / "runs"
    code = main(["profile", "--matrix", _matrix(tmp_path, data), "--out", str(out), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not out.exists() or not any(out.rglob("*.gz"))


def test_matrix_runs_launch_once_per_rank_count(tmp_path, capsys, monkeypatch):
    """A matrix of four runs on 8 and 2 ranks is two launches, each run in its own folder with the
    configuration it named; the command's flags are the defaults the matrix overrides."""
    launches = []

    def torchrun(cmd, **kwargs):
        plan = json.loads(Path(cmd[cmd.index("--plan") + 1]).read_text())
        nproc = int(next(a for a in cmd if a.startswith("--nproc-per-node=")).split("=")[1])
        launches.append((nproc, [(Path(r["out"]).parent.name, r["config"], r["instrument"], r["lean"])
                                 for r in plan["runs"]]))  # fmt: skip
        for r in plan["runs"]:
            staging = Path(r["out"])
            for rank in range(nproc):
                (staging / f"rank{rank}.pt.trace.json.gz").write_text("t")
            (staging / "run.json").write_text("{}")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(launch.subprocess, "run", torchrun)
    matrix = {
        "defaults": {"layers": 1},
        "runs": {
            "m": {"scheme": "megatron"},
            "m-stray": {"scheme": "megatron", "fault": "stray-full-save", "fault-layer": 0},
            "u2": {"scheme": "ulysses", "nproc": 2, "instrument": False},
            "usp": {"scheme": "usp", "lean": True},
        },
    }
    out = tmp_path / "runs"
    argv = ["profile", "--matrix", _matrix(tmp_path, matrix), "--out", str(out), "--device", "cpu", "--seq", "64"]
    assert main(argv) == 0, capsys.readouterr().err
    assert [(n, [r[0] for r in runs]) for n, runs in launches] == [(8, ["m", "m-stray", "usp"]), (2, ["u2"])]
    configs = {name: (cfg, inst, lean) for _, runs in launches for name, cfg, inst, lean in runs}
    assert all(cfg["layers"] == 1 and cfg["seq"] == 64 for cfg, _, _ in configs.values())
    assert (configs["m-stray"][0]["fault"], configs["m-stray"][0]["fault_layer"]) == ("stray-full-save", 0)
    assert configs["u2"][0]["sp_size"] == 2 and configs["u2"][1:] == (False, False)
    assert configs["usp"][0]["ulysses_degree"] == 2 and configs["usp"][1:] == (True, True)
    for name in configs:
        assert (out / name / "run.json").exists() and not list((out / name).glob(".staging-*"))


@pytest.mark.distributed
def test_profile_one_rank_end_to_end(tmp_path, capsys):
    out = tmp_path / "p1"
    code = main(
        ["profile", "--scheme", "megatron", "--nproc", "1", "--layers", "1", "--out", str(out), "--warmup", "0"]
    )
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["logs", "rank0.pt.trace.json.gz", "run.json"]
    info = json.loads((out / "run.json").read_text())
    assert info["world_size"] == 1 and info["config"]["sp_size"] == 1 and info["config"]["layers"] == 1
    assert "wrote 1 traces" in capsys.readouterr().err


@pytest.mark.distributed
def test_demo_profiles_the_three_schemes(profiled):
    result = profiled.demo()
    for scheme in ("megatron", "ulysses", "hybrid"):
        run = profiled(scheme)
        assert f"{run}/" in result.stdout
        assert len(list(run.glob("rank*.pt.trace.json.gz"))) == 8
        assert json.loads((run / "run.json").read_text())["config"]["scheme"] == scheme
    assert result.stdout.startswith("Profiled one training step of each scheme on 8 ranks, in one launch:")
    assert "megatron  MATCH: 21 collectives and 1.64 MiB on the wire per rank" in result.stdout
    assert "ulysses   MATCH: 17 collectives" in result.stdout and "hybrid    MATCH: 27 collectives" in result.stdout
    assert result.stdout.count("PASS: every tensor alive at the boundary is sharded") == 3
    assert "communication" in result.stdout and "% of the step" in result.stdout
    assert "sptrace dash " in result.stdout  # --no-serve: says how to browse instead of serving
