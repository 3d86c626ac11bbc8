"""GIVEN traces written by a user's own code (DeepSpeed-Ulysses' sequence-first layout, profiled
with plain torch.profiler: no run.json, no sptrace markers) and the truth its script recorded
(the model it built, CommDebugMode's collective counts)
WHEN a newcomer walks the README's path for foreign traces: info -> collectives -> init-config ->
analyze -> check -> report
THEN each step answers from the trace alone, init-config reads the model the script built, and
with that file every later command takes the model the same way and gives its verdict."""

from __future__ import annotations

import json
import re

import yaml

from sptrace.cli import main

NAME = "deepspeed_ulysses"


def test_the_foreign_trace_path(user_runs, tmp_path, capsys, private_cache):
    run = user_runs / NAME
    truth = json.loads((user_runs / "oracle" / NAME / "rank0.json").read_text())
    model, counts = truth["config"], truth["comm_counts"]
    assert not (run / "run.json").exists()
    cache = ["--cache-dir", str(private_cache)]

    # info: the ranks, and which analyses the traces allow
    assert main(["info", str(run), *cache]) == 0
    out = capsys.readouterr().out
    assert "ranks:        0-7 of world size 8" in out
    assert "yes  retained-activation check (sptrace check)" in out

    # collectives: every all-to-all CommDebugMode counted, on every rank, with the time origin said
    assert main(["collectives", str(run), *cache]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("start ms: from the rank's step start")
    per_rank = sum(counts.values())
    assert f"{8 * per_rank} collectives on 8 ranks" in out
    assert len(re.findall(r"^\s+\d+\s+all_to_all\s", out, re.M)) == 8 * per_rank

    # init-config: what the traces show of the model the script built
    config = tmp_path / "model.yaml"
    assert main(["init-config", str(run), "-o", str(config), *cache]) == 0
    assert "fill in the nulls" in capsys.readouterr().err
    read = yaml.safe_load(config.read_text())
    expected = {"scheme": "ulysses", "sp_size": model["sp"], "layers": model["layers"], "batch": model["batch"],
                "seq": model["seq"], "hidden": model["hidden"], "heads": model["heads"],
                "dtype": "float32"}  # fmt: skip
    assert {k: read[k] for k in expected} == expected
    assert read["ffn"] is None and read["kv_heads"] is None  # not in the trace: left to the user
    assert re.search(r"^ffn:\s+null\s+# F.*\(needed by the ulysses cost model\)", config.read_text(), re.M)

    # analyze with that file: the script runs no gradient sync (plain SGD on each rank), so the
    # window is scoped with --no-grad-sync; its collectives are then exactly the model's
    assert main(["analyze", str(run), "--config", str(config), "--no-grad-sync", *cache]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(f"MATCH: {per_rank} collectives and ")
    assert re.search(rf"^0-7\s+{per_rank}\s+{per_rank}\s", out, re.M), out  # one row for the 8 equal ranks
    # without the scope, the model expects a gradient all-reduce the script never issues
    assert main(["analyze", str(run), "--config", str(config), "--ffn", "96", *cache]) == 1
    assert "MISMATCH" in capsys.readouterr().out.splitlines()[-1]

    # check with the same file: the script saves only shards
    assert main(["check", str(run), "--config", str(config), *cache]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("PASS: ")

    # report: the same verdict, in the page
    page = tmp_path / "report.html"
    assert main(["report", str(run), "--config", str(config), "--html", str(page), *cache]) == 0
    assert verdict in page.read_text()


def test_check_names_what_it_lacks_before_parsing(tmp_path, capsys, monkeypatch):
    """A trace profiled without profile_memory: check says so at once, before any trace is parsed,
    and so do missing B, S and H, all of them in one line."""
    from tests.trace_helpers import write_gpu_run

    run = write_gpu_run(tmp_path / "run")
    import sptrace.analysis

    def no_parse(*args, **kwargs):
        raise AssertionError("the traces were parsed")

    monkeypatch.setattr(sptrace.analysis, "gather_run", no_parse)
    assert main(["check", str(run), "--sp", "2", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "needs --batch, --seq, --hidden, which neither" in err and err.count("\n") == 1
    assert main(["check", str(run), "--batch", "2", "--seq", "64", "--hidden", "48", "--sp", "2", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "rank0" in err and "neither [memory] events nor sptrace.saved records" in err and err.count("\n") == 1


def test_run_json_keys_sptrace_does_not_read_are_named(tmp_path, capsys):
    """A flat run.json with a misspelt size: the key is named, never silently unknown; the
    aliases --config takes (sp for sp_size, dashes) are read there too."""
    from tests.trace_helpers import write_gpu_run

    run = write_gpu_run(tmp_path / "run")
    (run / "run.json").write_text(json.dumps({"batch": 2, "seq": 64, "hiden": 48, "sp": 2, "kv-heads": 4}))
    assert main(["check", str(run), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "needs --hidden, which neither" in err  # sp came from run.json's "sp"
    assert "run.json: hiden is no model field sptrace reads (ignored)" in err
    assert main(["analyze", str(run), "--no-cache"]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "hiden is no model field" in err and "kv-heads" not in err
