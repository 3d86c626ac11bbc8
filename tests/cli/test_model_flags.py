"""GIVEN a run without run.json (a foreign run: nothing declares its model)
WHEN its model is given as flags or as a --config file (YAML or JSON, run_info's keys), to any
command that analyses (check, analyze, report, dash)
THEN each command takes it the same way, a bad config file is one line naming the file and the
key before any trace is read, and a run.json written flat (shaped like run_info) is read."""

from __future__ import annotations

import json
import shutil

import pytest

from sptrace.cli import main


@pytest.fixture
def foreign(profiled, tmp_path):
    """The stray-save reference run with its run.json taken away, and the shape it declared."""
    src = profiled("megatron-stray-full-save")
    run = tmp_path / "foreign"
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("logs", "run.json"))
    declared = json.loads((src / "run.json").read_text())["config"]
    shape = {k: declared[k] for k in ("batch", "seq", "hidden", "sp_size")}
    return run, shape


def test_report_and_check_take_the_model_as_flags_or_a_config_file(foreign, tmp_path, capsys, private_cache):
    run, shape = foreign
    cache = ["--cache-dir", str(private_cache), "--workers", "1"]
    flags = ["--batch", str(shape["batch"]), "--seq", str(shape["seq"]), "--hidden", str(shape["hidden"]),
             "--sp", str(shape["sp_size"])]  # fmt: skip
    # without the model the report cannot check the sharding, and says which flags it needs
    assert main(["report", str(run), "--html", str(tmp_path / "bare.html"), *cache]) == 0
    bare = (tmp_path / "bare.html").read_text()
    assert "not checked" in bare and "--batch" in bare
    # the same flags check takes: the report shows check's FAIL
    assert main(["check", str(run), *flags, *cache]) == 1
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("FAIL: ")
    assert main(["report", str(run), "--html", str(tmp_path / "flags.html"), *flags, *cache]) == 0
    assert verdict in (tmp_path / "flags.html").read_text()
    # a YAML config with run_info's keys says the same (sp for sp_size, dashes or underscores)
    config = tmp_path / "model.yaml"
    config.write_text("# the run's shape\n" + "".join(f"{k.replace('sp_size', 'sp')}: {v}\n" for k, v in shape.items()))
    assert main(["check", str(run), "--config", str(config), *cache]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == verdict
    assert main(["report", str(run), "--html", str(tmp_path / "config.html"), "--config", str(config), *cache]) == 0
    assert verdict in (tmp_path / "config.html").read_text()
    # a flag wins over the config file: a wrong --seq makes the check undecided
    assert main(["check", str(run), "--config", str(config), "--seq", str(2 * shape["seq"]), *cache]) == 2
    capsys.readouterr()
    # a run.json written flat, shaped like profile_step's run_info, is read
    (run / "run.json").write_text(json.dumps(shape))
    assert main(["check", str(run), *cache]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == verdict


def test_dash_takes_the_model_flags(foreign, capsys, private_cache):
    from sptrace.dashboards.app import create_app

    run, shape = foreign
    # the dashboard's parser takes them (a bad port is refused after the flags were read)
    assert main(["dash", str(run), "--batch", "2", "--config", "/nonexistent.yaml", "--port", "0"]) == 2
    assert "/nonexistent.yaml" in capsys.readouterr().err
    from sptrace.vocab.shape import Declarations

    options = {"flags": Declarations((("flags", shape),)), "load_options": {"cache_dir": str(private_cache)}}
    a = create_app([run], options=options).sptrace_store.get(0)
    assert a.sharding is not None and a.sharding.verdict.status == "fail"


@pytest.mark.parametrize(
    "text, message",
    [
        ("seq: 64\nhiden: 48\n", "unknown key hiden"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("seq: [unclosed\n", "not YAML or JSON"),
        ('{"config": {"seq": -4}}', "--seq must be a positive integer"),
    ],
)
def test_a_bad_config_file_is_one_line_before_any_trace_is_read(tmp_path, capsys, text, message):
    config = tmp_path / "model.yaml"
    config.write_text(text)
    missing_run = tmp_path / "no-such-run"  # never reached: the config is read first
    missing_run.mkdir()
    assert main(["check", str(missing_run), "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(config) in err[0] and message in err[0], err


def test_sweep_takes_the_model_from_a_config_file(tmp_path, monkeypatch, capsys):
    """sweep --config: the file's sizes for the reference model, a flag winning over the file; S,
    the schemes and P stay sweep's own (--seq, --schemes, --nproc), and the file's are named as
    not taken. Nothing is launched: the sweep's first configuration is caught."""
    import sptrace.cli.sweep

    seen = {}

    class Caught(Exception):
        pass

    def caught(base, schemes, seqs, out, **kwargs):
        seen.update(base=base, schemes=schemes, seqs=seqs)
        raise Caught

    monkeypatch.setattr(sptrace.cli.sweep, "run_sweep", caught)
    config = tmp_path / "model.yaml"
    config.write_text("hidden: 48\nheads: 8\nkv-heads: 4\nffn: 96\nseq: 4096\nscheme: ulysses\n")
    with pytest.raises(Caught):
        main(["sweep", "--seq", "64,128", "--out", str(tmp_path / "sweep"), "--config", str(config),
              "--ffn", "160", "--nproc", "8", "--schemes", "megatron"])  # fmt: skip
    base = seen["base"]
    assert (base.hidden, base.heads, base.kv_heads, base.ffn) == (48, 8, 4, 160)
    assert seen["schemes"] == ["megatron"] and seen["seqs"] == [64, 128] and base.sp_size == 8
    assert "scheme, seq not taken" in capsys.readouterr().err
    # a key that is no field is an error naming it, before anything runs
    config.write_text("hiden: 48\n")
    assert main(["sweep", "--seq", "64", "--out", str(tmp_path / "sweep"), "--config", str(config)]) == 2
    assert "unknown key hiden" in capsys.readouterr().err
