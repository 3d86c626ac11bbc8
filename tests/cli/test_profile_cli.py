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
        staging = Path(cmd[cmd.index("--out") + 1])
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
    assert result.stdout.startswith("Profiled one training step of each scheme on 8 ranks:")
    assert "megatron  MATCH: 21 collectives and 1.64 MiB on the wire per rank" in result.stdout
    assert "ulysses   MATCH: 17 collectives" in result.stdout and "hybrid    MATCH: 27 collectives" in result.stdout
    assert result.stdout.count("PASS: every judged tensor is sharded") == 3
    assert "communication" in result.stdout and "% of the step" in result.stdout
    assert "sptrace dash " in result.stdout  # --no-serve: says how to browse instead of serving
