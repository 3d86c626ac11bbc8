"""`sptrace analyze` on a run that declares no model of the job: the ranks compared with each
other. The traces are written here, so each test knows what every rank issued: 2 steps x 2
layers = 4 bf16 all-reduces of 24576 elements (48 KiB) per rank, on process group "0"."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from sptrace.cli import main
from tests.trace_helpers import gpu_trace

WORLD = 4


def write_run(root: Path, edit=None) -> Path:
    """A 4-rank NCCL run; ``edit(rank, trace)`` changes a rank's trace before it is written."""
    root.mkdir(parents=True)
    for rank in range(WORLD):
        trace = gpu_trace(rank, WORLD)
        if edit is not None:
            edit(rank, trace)
        (root / f"rank{rank}.json").write_text(json.dumps(trace))
    return root


def comm_records(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("name") == "record_param_comms"]


def analyze_json(path: Path, capsys, tmp_path) -> tuple[int, dict]:
    code = main(["analyze", str(path), "--format", "json", "--cache-dir", str(tmp_path / "cache")])
    return code, json.loads(capsys.readouterr().out)


def test_consistent_ranks_pass_and_say_the_model_was_skipped(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    assert main(["analyze", str(run), "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "CONSISTENT: 4 collectives per rank; 4 matched across ranks agree in kind and size" in out
    assert "the cost-model comparison was skipped" in out and "needs --scheme" in out
    assert "arrived last" in out  # the straggler, from the kernels' start times
    code, report = analyze_json(run, capsys, tmp_path)
    assert code == 0 and report["verdict"]["label"] == "CONSISTENT" and report["matched"] == 4
    assert [r["collectives"] for r in report["ranks"]] == [4] * WORLD
    assert [r["wire_bytes"] for r in report["ranks"]] == [4 * 2 * 3 / 4 * 48 * 1024] * WORLD  # ring all-reduce
    assert report["cost_model"]["skipped"].startswith("the cost model needs --scheme, ")
    assert len(report["matched_collectives"]) == 4


def test_a_rank_that_issues_another_size_is_inconsistent(tmp_path, capsys):
    def edit(rank, trace):
        if rank == 2:  # its third all-reduce carries twice the elements
            third = comm_records(trace)[2]["args"]
            third["In msg nelems"] = third["Out msg nelems"] = 2 * 24576

    run = write_run(tmp_path / "run", edit)
    code, report = analyze_json(run, capsys, tmp_path)
    assert code == 1 and report["verdict"]["label"] == "INCONSISTENT"
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [(f["code"], f["ranks"]) for f in errors] == [("mismatched-collective", [2])]
    assert "#2" in errors[0]["message"] and "all_reduce of 96.00 KiB" in errors[0]["message"]
    assert "issued all_reduce of 48.00 KiB" in errors[0]["message"]
    assert [r["disagree"] for r in report["ranks"]] == [0, 0, 1, 0]
    assert main(["analyze", str(run), "--cache-dir", str(tmp_path / "cache")]) == 1
    out = capsys.readouterr().out
    assert "error: rank 2: group 0: its collective #2" in out
    # ranks that agree share one row; the rank that differs stands on its own
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ranks "))
    table = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 : start + 3]]
    assert table[0][:4] == ["0-1, 3", "4", "288.00 KiB", "0"] and table[1][:4] == ["2", "4", "360.00 KiB", "1"], out
    assert lines[start + 3].startswith("  (times: the range over the row's ranks")
    assert "+?" not in out  # every size is in the trace: no legend for unknown sizes


def test_without_a_named_group_a_disagreement_cannot_decide(tmp_path, capsys):
    def edit(rank, trace):
        del trace["distributedInfo"]["pg_config"]
        for record in comm_records(trace):
            del record["args"]["Process Group Name"], record["args"]["Process Group Ranks"]
        if rank == 1:
            comm_records(trace)[0]["args"]["In msg nelems"] = 2 * 24576

    code, report = analyze_json(write_run(tmp_path / "run", edit), capsys, tmp_path)
    # a desync and two groups look the same where no group is named: neither CONSISTENT nor an error
    assert code == 2 and report["verdict"]["label"] == "CANNOT DECIDE", report["findings"]
    assert "disagree where the trace names no process group" in report["verdict"]["summary"]
    (finding,) = [f for f in report["findings"] if f["code"] == "mismatched-collective"]
    assert finding["severity"] == "warning" and finding["ranks"] == [1] and "may be two groups" in finding["message"]
    assert finding["message"].startswith("the process group the trace does not name: its collective #0")


def test_one_rank_alone_is_not_consistent(tmp_path, capsys):
    """A single rank's trace matches nothing across ranks: CANNOT DECIDE, and no straggler."""
    run = write_run(tmp_path / "run", lambda rank, trace: None)
    for f in run.iterdir():
        if f.name.startswith("rank") and not f.name.startswith("rank0"):
            f.unlink()
    code, report = analyze_json(run, capsys, tmp_path)
    assert code == 2 and "none was matched on two or more ranks" in report["verdict"]["summary"]
    assert not [f for f in report["findings"] if f["code"] == "straggler"]


def test_a_rank_with_fewer_collectives_is_a_warning(tmp_path, capsys):
    def edit(rank, trace):
        if rank == 3:  # its window stops before the last all-reduce
            last = comm_records(trace)[-1]
            trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ts", -1) < last["ts"] - 1]

    code, report = analyze_json(write_run(tmp_path / "run", edit), capsys, tmp_path)
    assert code == 0
    (count,) = [f for f in report["findings"] if f["code"] == "collective-count"]
    assert count["ranks"] == [3] and "3 collectives where most of its ranks issued 4" in count["message"]


def test_no_collectives_cannot_decide(tmp_path, capsys):
    def edit(rank, trace):
        comm = ("c10d::", "record_param_comms", "cuLaunchKernelEx", "nccl")
        trace["traceEvents"] = [e for e in trace["traceEvents"] if not str(e.get("name", "")).startswith(comm)]

    code, report = analyze_json(write_run(tmp_path / "run", edit), capsys, tmp_path)
    assert code == 2 and report["verdict"]["label"] == "CANNOT DECIDE"


@pytest.mark.distributed
def test_a_reference_run_without_its_run_json(profiled, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(profiled("megatron"), bare, ignore=shutil.ignore_patterns("logs", "run.json"))
    assert main(["analyze", str(bare), "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "8 of 8 ranks, compared with each other" in out and "CONSISTENT" in out
    assert main(["analyze", str(profiled("megatron")), "--format", "json"]) == 0
    declared = json.loads(capsys.readouterr().out)
    code, bare_report = analyze_json(bare, capsys, tmp_path)
    assert code == 0
    # the same collectives are seen with or without a model of the job
    assert [r["collectives"] for r in bare_report["ranks"]] == [r["observed"] for r in declared["ranks"]]


def test_analyze_asks_only_for_the_sizes_the_scheme_depends_on(profiled, tmp_path, capsys):
    """Megatron-SP's collectives carry [B, S, H] whatever F is, and --kv-heads defaults to --heads:
    B, S, H and a are enough. Ulysses all-reduces the MLP's gradients too, so it needs F, unless
    the window ends before the gradient sync (--no-grad-sync)."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    for scheme in ("megatron", "ulysses"):
        src = profiled(scheme)
        cfg = json.loads((src / "run.json").read_text())["config"]
        bare = tmp_path / scheme
        shutil.copytree(src, bare, ignore=shutil.ignore_patterns("logs", "run.json"))
        sizes = ["--scheme", scheme, "--batch", str(cfg["batch"]), "--seq", str(cfg["seq"]),
                 "--hidden", str(cfg["hidden"]), "--heads", str(cfg["heads"])]  # fmt: skip
        code = main(["analyze", str(bare), *sizes, *cache])
        out = capsys.readouterr().out
        if scheme == "megatron":  # the norms' gradient all-reduce is [L x 2H]: no F in it
            assert code == 0 and "MATCH" in out.splitlines()[-1], out
            # the dtype was read off the layers' collectives, L off the layers they name
            assert out.splitlines()[0].startswith(f"megatron: P=8 L=2 B={cfg['batch']} S={cfg['seq']}"), out
            continue
        assert code == 0 and "the cost model of ulysses needs --ffn; pass it" in out, out
        assert "--kv-heads" not in out.splitlines()[0]
        code = main(["analyze", str(bare), *sizes, "--ffn", str(cfg["ffn"]), "--kv-heads", str(cfg["kv_heads"]),
                     *cache])  # fmt: skip
        assert code == 0 and "MATCH" in capsys.readouterr().out
        # a window without the gradient sync: the model leaves it out, and F is not needed
        assert main(["analyze", str(bare), *sizes, "--kv-heads", str(cfg["kv_heads"]), "--no-grad-sync", *cache,
                     "--format", "json"]) == 1  # fmt: skip
        report = json.loads(capsys.readouterr().out)
        assert {f["code"] for f in report["findings"] if f["severity"] == "error"} == {"extra-collective"}
        assert all("gradient" in f["message"] or "all_reduce" in f["message"]
                   for f in report["findings"] if f["code"] == "extra-collective")  # fmt: skip
