"""GIVEN the tensors a step keeps across the forward -> backward boundary
WHEN they are projected to a production shape (``sptrace check --at``, a ``production:`` block)
THEN each dimension is named by what it is (B, S, S/P, H, F/P, a/P, d) and scaled to production;
a dimension several names fit with different production values, one no name fits, or a name
whose production value is unknown leaves its tensor unprojected, carried as measured and said
why; per rank the boundary that kept the most is projected (never a sum over boundaries), its
layers by their mean times the production layers; each FAIL's extra bytes likewise; and
Korthikanti's figure per layer is the paper's formula at the production shape."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from sptrace.checks.dim_names import read_dims, symbol_values
from sptrace.checks.findings import Finding
from sptrace.checks.production import parse_at, production_shape
from sptrace.checks.projection import project
from sptrace.cli import main
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import ModelShape, config_values

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "runs"
STRAY = GOLDEN / "megatron-stray-full-save"  # megatron, P=2 B=2 S=32 H=48 a=4 g=4 F=64 float32, 1 layer; a FAIL
LLAMA = "seq=131072,hidden=8192,layers=80,heads=64,ffn=28672"
KEEPERS = ("autograd", "model", "offloaded")


def _reading(measured: ModelShape, target: ModelShape, shape: tuple[int, ...], cls: str | None):
    m = {k: v for k, v in symbol_values(_base(measured), measured.scheme).items() if v is not None}
    base = _base(target)
    return read_dims(shape, cls, m, symbol_values(base, measured.scheme), base)


def _base(model: ModelShape) -> dict[str, int | None]:
    return {"B": model.batch, "S": model.seq, "P": model.sp_size, "H": model.hidden, "a": model.heads,
            "g": model.kv_heads, "F": model.ffn}  # fmt: skip


# ---- naming dimensions ---------------------------------------------------------------------------


def test_a_dimension_two_names_fit_stays_unprojected_and_says_which():
    # S == H: a [B, 64] tensor could be [B, S] or [B, H], and they differ at production
    measured = ModelShape(
        scheme="megatron", batch=2, seq=64, hidden=64, sp_size=8, heads=8, kv_heads=8, dtype="float32"
    )
    target = production_shape(measured, (("--at", parse_at("seq=4096,hidden=1024,heads=8,kv_heads=8")),))
    r = _reading(measured, target, (2, 64), "other")
    assert r.numel is None and r.labels is None
    assert "64 could be S or H" in r.why
    # a [B, S/P, H] activation is named whatever collides: the width is last in its layout
    r = _reading(measured, target, (2, 8, 64), "seq-sharded")
    assert r.labels == ("B", "S/P", "H") and r.numel == 2 * (4096 // 8) * 1024


def test_the_class_names_the_sequence_position():
    # B == P makes B*S/P == S: a [512, 96] tensor is [S, H] if full, [B*S/P, H] if a sequence shard
    measured = ModelShape(scheme="megatron", batch=8, seq=512, hidden=96, sp_size=8, heads=4, kv_heads=4)
    target = production_shape(measured, (("--at", parse_at("seq=8192,hidden=1024,batch=1")),))
    full = _reading(measured, target, (512, 96), "full")
    assert full.labels == ("S", "H") and full.numel == 8192 * 1024
    shard = _reading(measured, target, (512, 96), "seq-sharded")
    assert shard.labels == ("B*S/P", "H") and shard.numel == 1 * 8192 // 8 * 1024
    unsure = _reading(measured, target, (512, 96), "ambiguous")
    assert unsure.numel is None and "512 could be S or B*S/P" in unsure.why


def test_a_name_unknown_at_production_leaves_the_tensor_unprojected_with_the_reason():
    measured = ModelShape(scheme="megatron", batch=2, seq=512, hidden=96, sp_size=8, heads=16, kv_heads=16, ffn=320)
    no_ffn = production_shape(measured, (("--at", parse_at("seq=8192,hidden=1024,heads=16,kv_heads=16")),))
    r = _reading(measured, no_ffn, (2, 512, 40), "head-sharded")  # [B, S, F/P]
    assert r.numel is None and "F/P needs ffn at production (--at ffn=N)" in r.why
    with_ffn = production_shape(measured, (("--at", parse_at("seq=8192,hidden=1024,heads=16,kv_heads=16,ffn=4096")),))
    r = _reading(measured, with_ffn, (2, 512, 40), "head-sharded")
    assert r.labels == ("B", "S", "F/P") and r.numel == 2 * 8192 * 4096 // 8
    # a width the measured run does not declare names no dimension
    bare = ModelShape(scheme="megatron", batch=2, seq=512, hidden=96, sp_size=8, heads=16, kv_heads=16)
    r = _reading(bare, with_ffn, (2, 512, 40), "head-sharded")
    assert r.numel is None and "40 is none of the model's dimensions" in r.why


def test_heads_and_kv_heads_are_told_apart_only_when_they_differ_at_production():
    measured = ModelShape(scheme="ulysses", batch=1, seq=256, hidden=64, sp_size=4, heads=8, kv_heads=8)
    mha = production_shape(measured, (("--at", parse_at("seq=4096,hidden=1024,heads=16,kv_heads=16")),))
    assert _reading(measured, mha, (1, 2, 256, 8), "head-sharded").numel == 16 // 4 * 4096 * 64
    gqa = production_shape(measured, (("--at", parse_at("seq=4096,hidden=1024,heads=16,kv_heads=4")),))
    r = _reading(measured, gqa, (1, 2, 256, 8), "head-sharded")  # q or k: the measured run cannot say
    assert r.numel is None and "2 could be a/P or g/P" in r.why
    no_kv = production_shape(measured, (("--at", parse_at("seq=4096,hidden=1024,heads=16")),))
    assert "g/P needs kv_heads at production" in _reading(measured, no_kv, (1, 2, 256, 8), "head-sharded").why


# ---- --at and production blocks ------------------------------------------------------------------


def test_parse_at():
    values = parse_at("seq=131072, hidden=8192,layers=80,heads=64,kv=8,ffn=28672,sp=8,dtype=bf16,batch=1")
    assert values == {"seq": 131072, "hidden": 8192, "layers": 80, "heads": 64, "kv_heads": 8, "ffn": 28672,
                      "sp_size": 8, "dtype": "bfloat16", "batch": 1}  # fmt: skip
    measured = ModelShape(scheme="megatron", batch=2, seq=32, hidden=48, sp_size=2, heads=4, kv_heads=4, ffn=64,
                          dtype="float32", layers=1, recompute="none")  # fmt: skip
    target = production_shape(measured, (("--at", parse_at("seq=1024,hidden=512")),))
    # batch, P and dtype stay the measured run's; heads, kv_heads, ffn and layers are unknown unless given
    assert (target.batch, target.sp_size, target.dtype, target.recompute) == (2, 2, "float32", "none")
    assert (target.heads, target.kv_heads, target.ffn, target.layers) == (None, None, None, None)
    assert target.provenance["seq"] == "--at" and target.provenance["batch"].startswith("measured")


@pytest.mark.parametrize(
    "at, says",
    [
        ("seq=131072,width=8192", "unknown key 'width'"),
        ("seq=128k", "seq must be a positive integer"),
        ("seq=0", "seq must be a positive integer"),
        ("seq", "expected key=value"),
        ("seq=1,seq=2", "seq given twice"),
        ("dtype=int8", "not an activation dtype"),
    ],
)
def test_bad_at_is_one_line_and_exit_2(at, says, capsys, tmp_path):
    with pytest.raises(UsageError, match=says):
        parse_at(at)
    assert main(["check", str(STRAY), "--at", at, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and err[0].startswith("sptrace: error: --at: ")


def test_production_blocks_in_the_config_file_and_run_json(tmp_path, capsys):
    assert config_values({"seq": 32, "production": {"seq": 4096}}, "x.yaml") == {"seq": 32}
    run = tmp_path / "run"
    shutil.copytree(STRAY, run)
    info = json.loads((run / "run.json").read_text())
    info["config"]["production"] = {"seq": 1024, "hidden": 256, "layers": 4}
    (run / "run.json").write_text(json.dumps(info))
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["check", str(run), "--format", "json", *cache]) == 1
    target = json.loads(capsys.readouterr().out)["projection"]["target"]
    assert (target["seq"], target["hidden"], target["layers"]) == (1024, 256, 4)
    assert target["provenance"]["seq"] == "run.json production"
    config = tmp_path / "model.yaml"
    config.write_text("production:\n  seq: 2048\n  heads: 8\n")
    assert main(["check", str(run), "--config", str(config), "--at", "layers=8", "--format", "json", *cache]) == 1
    target = json.loads(capsys.readouterr().out)["projection"]["target"]
    assert (target["seq"], target["hidden"], target["heads"], target["layers"]) == (2048, 256, 8, 8)
    assert target["provenance"]["layers"] == "--at" and target["provenance"]["seq"].endswith("production")
    config.write_text("production:\n  seq: lots\n")
    assert main(["check", str(run), "--config", str(config), *cache]) == 2
    assert "production: seq must be a positive integer" in capsys.readouterr().err
    # no production shape: no projection
    assert main(["check", str(STRAY), "--format", "json", *cache]) == 1
    assert "projection" not in json.loads(capsys.readouterr().out)


# ---- the projection of a report ------------------------------------------------------------------


def _row(rank, layer, shape, cls, step, storage=None, holder="autograd", module=None, boundary=""):
    nbytes = 4 * math.prod(shape) if shape is not None else 8
    return {"rank": rank, "module": module or (f"layers.{layer}.mlp" if layer is not None else None),
            "layer": float("nan") if layer is None else float(layer), "shape": shape, "dtype": "float32",
            "nbytes": nbytes, "storage_bytes": storage or nbytes, "holder": holder, "class": cls, "why": "",
            "step": step, "micro_batch": 0, "boundary": boundary}  # fmt: skip


def test_the_worst_boundary_is_projected_layers_by_their_mean():
    # P=4 B=2 S=64 H=24 (S/P=16, F/P=8); step 1 keeps more than step 0: only step 1 is projected
    model = ModelShape(scheme="megatron", batch=2, seq=64, hidden=24, sp_size=4, heads=4, kv_heads=4, ffn=32,
                       layers=2, dtype="float32", recompute="none")  # fmt: skip
    rows = [
        _row(0, 0, (2, 16, 24), "seq-sharded", 0),  # step 0: less than step 1
        _row(0, 0, (2, 16, 24), "seq-sharded", 1),
        _row(0, 0, (2, 64, 8), "head-sharded", 1, storage=3 * 4 * 2 * 64 * 8),  # a view on a 3x storage
        _row(0, 1, (2, 16, 24), "seq-sharded", 1),
        _row(0, 1, (128, 24), "full", 1, module="layers.1.mlp.fc1", boundary="step 1"),  # [B*S, H]: a FAIL
        _row(0, 1, (5, 7), "other", 1),  # names no dimension: carried as measured
        _row(0, None, (2, 16, 24), "seq-sharded", 1),
        _row(0, None, (2, 16, 24), "seq-sharded", 1, holder="backend"),  # not the step's
    ]
    saved = pd.DataFrame(rows)
    message = "layers.1.mlp.fc1 keeps a full-sequence [128x24] float32 tensor across the boundary of step 1 (...)"
    fail = Finding("error", "sharding", "full-size-save", message, (0,), 1, "layers.1.mlp.fc1")
    report = SimpleNamespace(model=model, saved=saved, findings=[fail])
    target = production_shape(model, (("--at", parse_at("seq=1024,hidden=256,layers=10,ffn=512,sp=8")),))
    p = project(report, target)  # type: ignore[arg-type]
    (r,) = p.ranks
    B, S, H, Fp, P = 2, 1024, 256, 512 // 8, 8
    shard = B * S // P * H * 4
    layer0 = shard + 3 * B * S * Fp * 4
    layer1 = shard + B * S * H * 4
    assert r.measured_bytes == int(saved[saved["step"] == 1].query("holder != 'backend'")["storage_bytes"].sum())
    assert r.per_layer_bytes == (layer0 + layer1) / 2 and r.measured_layers == 2
    assert r.projected_bytes == (layer0 + layer1) / 2 * 10 + shard
    assert r.unprojected_bytes == 4 * 5 * 7 and r.total_bytes == r.projected_bytes + 4 * 5 * 7
    (left,) = r.unprojected
    assert left.why == "5 is none of the model's dimensions (B=2, S=64, S/P=16, H=24, a=4, g=4, d=6, F=32, F/P=8)"
    (f,) = p.fails
    assert f.labels == ("B*S", "H") and f.measured_extra_bytes == 128 * 24 * 4 * (1 - 1 / 4)
    assert f.projected_extra_bytes == B * S * H * 4 * (1 - 1 / P)
    assert p.korthikanti_per_layer is None and "heads" in p.korthikanti_why


# ---- end to end: the stray-save reference run at a Llama-70B-like shape ---------------------------

# the golden run's kept tensors, named by hand: measured P=2 B=2 S=32 H=48 a=4 F=64 (S/P=16, d=12, F/P=32)
B, S, H, P, A, F = 2, 131072, 8192, 2, 64, 28672
D = H // A
HAND = {
    (2, 16, 48): B * (S // P) * H,  # [B, S/P, H]
    (2, 16, 1): B * (S // P),  # [B, S/P, 1]: a norm's statistics
    (1, 32, 1, 12): S * D,  # [1, S, 1, d]: a rotary table over the gathered sequence
    (64, 48): B * S * H,  # [B*S, H]: the gathered stray
    (2, 32, 32): B * S * (F // P),  # [B, S, F/P]
    (64, 32): B * S * (F // P),  # [B*S, F/P]
}
ATTENTION = {(2, 2, 32, 12): B * (A // P) * S * D, (2, 2, 32): B * (A // P) * S}  # [B, a/P, S, d], [B, a/P, S]


def _hand(saved: list[dict], rank: int, dims: dict) -> tuple[float, float, int, int]:
    """(projected bytes in layer 0, outside layers, unprojected bytes, unprojected tensors) of the
    rank's boundary that kept the most, from the saved rows' shapes alone."""
    mine = [s for s in saved if s["rank"] == rank and s["holder"] in KEEPERS]
    by_boundary: dict[tuple, list[dict]] = {}
    for s in mine:
        by_boundary.setdefault((s["step"], s["micro_batch"]), []).append(s)
    worst = max(by_boundary.values(), key=lambda rows: sum(r["storage_bytes"] for r in rows))
    layered = outside = 0.0
    left = left_n = 0
    for s in worst:
        shape = tuple(s["shape"]) if s["shape"] is not None else None
        if shape not in dims:
            left, left_n = left + s["storage_bytes"], left_n + 1
            continue
        assert s["dtype"] == "float32"
        projected = dims[shape] * 4 * s["storage_bytes"] / s["nbytes"]
        if s["layer"] is None:
            outside += projected
        else:
            assert s["layer"] == 0
            layered += projected
    return layered, outside, left, left_n


def _korthikanti(s: int, b: int, h: int, a: int, t: int, dtype_bytes: int) -> float:
    return s * b * h / t * (34 + 5 * a * s / h) * dtype_bytes / 2


@pytest.mark.parametrize("kv_heads", [None, 64])
def test_check_at_projects_a_reference_run_to_a_llama_70b_like_shape(kv_heads, capsys, tmp_path):
    at = LLAMA + (f",kv_heads={kv_heads}" if kv_heads else "")
    assert main(["check", str(STRAY), "--at", at, "--format", "json", "--cache-dir", str(tmp_path)]) == 1
    out = json.loads(capsys.readouterr().out)
    p, saved = out["projection"], out["saved"]
    assert p["target"]["seq"] == S and p["target"]["batch"] == B and p["target"]["sp_size"] == P
    dims = HAND | (ATTENTION if kv_heads else {})
    for r in p["ranks"]:
        layered, outside, left, left_n = _hand(saved, r["rank"], dims)
        assert r["per_layer_bytes"] == pytest.approx(layered)
        assert r["projected_bytes"] == pytest.approx(layered * 80 + outside)
        assert (r["unprojected_bytes"], r["unprojected_tensors"]) == (left, left_n)
        assert r["total_bytes"] == pytest.approx(layered * 80 + outside + left)
        whys = {tuple(t["shape"]) if t["shape"] else None: t["why"] for t in r["tensors"] if t["why"]}
        assert whys[None] == "no shape recorded"
        if not kv_heads:  # q, k and v read alike at the measured shape: which are kv heads at production?
            assert "g/P needs kv_heads at production" in whys[(2, 2, 32, 12)]
    assert p["korthikanti_per_layer"] == pytest.approx(_korthikanti(S, B, H, A, P, 4))
    (fail,) = p["fails"]
    assert fail["module"] == "layers.0.mlp.fc1" and fail["ranks"] == [0, 1] and fail["labels"] == ["B*S", "H"]
    assert fail["measured_extra_bytes"] == 64 * 48 * 4 / 2
    assert fail["projected_extra_bytes"] == B * S * H * 4 * (1 - 1 / P)


def test_check_at_text(capsys, tmp_path):
    assert main(["check", str(STRAY), "--at", LLAMA + ",sp=8,batch=1", "--cache-dir", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("at seq=131072 hidden=8192 layers=80"))
    assert "(--at; float32 as measured)" in lines[head]
    assert lines[head + 1].startswith("  ranks 0-1 keep ") and " per boundary (measured " in lines[head + 1]
    assert f"(Korthikanti: {_human(_korthikanti(S, 1, H, A, 8, 4))} per layer)" in lines[head + 1]
    assert "unprojected" in lines[head + 1] and "kv_heads" in lines[head + 1]
    fail = B * 0 + 1 * S * H * 4 * (1 - 1 / 8)
    assert lines[head + 2] == (f"  FAIL layers.0.mlp.fc1 (ranks 0-1): {_human(fail)} more than a shard at "
                               "production size (measured 6.00 KiB)")  # fmt: skip
    assert lines[-1].startswith("FAIL: ")  # the verdict is the gate's, unchanged


def _human(n: float) -> str:
    from sptrace.vocab.units import human_bytes

    return human_bytes(n)


def test_the_report_and_the_memory_page_show_the_projection(tmp_path):
    from sptrace.dashboards.app import parse_view
    from sptrace.dashboards.pages import memory
    from sptrace.dashboards.store import RunStore

    assert main(["report", str(STRAY), "--at", LLAMA, "--html", str(tmp_path / "r.html"),
                 "--cache-dir", str(tmp_path / "cache")]) == 0  # fmt: skip
    page = (tmp_path / "r.html").read_text()
    assert "kept for backward at production size: seq=131072 hidden=8192 layers=80" in page
    assert "each FAIL&#x27;s bytes over a 1/P shard, at production" in page
    from sptrace.vocab.shape import Declarations

    options = {"flags": Declarations((), (("--at", parse_at(LLAMA)),)), "load_options": {"cache_dir": str(tmp_path)}}
    store = RunStore([STRAY], options=options)
    shown = json.dumps(memory.render(store, parse_view(store, "/memory", "?run=0")), default=str)
    assert "at production size: seq=131072" in shown and "memory-projection" in shown
