"""The analytic cost model against the first article's figures (SPEC.md §2) and hand-derived
cases."""

from __future__ import annotations

import json

import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.cli import main
from sptrace.costmodel import PRESETS, estimate_comm, korthikanti_bytes_per_layer
from sptrace.vocab.collective_kinds import wire_bytes

MiB, GiB = 2**20, 2**30


def preset(name, **changes):
    values = dict(PRESETS[name])
    attention_only = values.pop("attention_only")
    return StepConfig(**{**values, **changes}), attention_only


def test_attention_example_megatron_1120_mib():
    cfg, attn = preset("seed-attention", scheme="megatron")
    est = estimate_comm(cfg, attention_only=attn)
    assert est.wire_per_step() == 1120 * MiB  # 5 * N * r, N = 256 MiB
    assert est.count("all_gather") == 3 and est.count("reduce_scatter") == 2 and est.count() == 5


def test_attention_example_ulysses_672_mib():
    cfg, attn = preset("seed-attention", scheme="ulysses")
    est = estimate_comm(cfg, attention_only=attn)
    assert est.wire_per_step("all_to_all") == 224 * MiB  # 8 * N * r / P
    assert est.wire_per_step("all_reduce") == 448 * MiB  # 2 * G * r, G = 4 H^2 * 4 B
    assert est.wire_per_step() == 672 * MiB
    assert est.count("all_to_all") == 8


def test_seed_model_megatron_210_gib():
    cfg, _ = preset("seed-3.6b", scheme="megatron")
    est = estimate_comm(cfg)
    per_layer = 10 * (1 * 262144 * 6144 * 2) * 7 / 8
    assert est.wire_per_layer() == per_layer
    assert round(est.wire_per_step() / GiB, 2) == 210.00  # + 0.3 MiB of norm-gradient all-reduce
    assert est.count("all_gather") == 6 * 8 and est.count("reduce_scatter") == 4 * 8 and est.count("all_reduce") == 1


@pytest.mark.parametrize("k, gib", [(1, 38.72), (2, 44.63)])
def test_seed_model_deepspeed_zero3(k, gib):
    cfg, _ = preset("seed-3.6b", scheme="ulysses", zero3=True)
    est = estimate_comm(cfg, k=k)
    assert est.wire_per_step("all_to_all") == 21 * GiB
    assert round(est.wire_per_step() / GiB, 2) == gib
    params = 8 * (6144 * 144 * 128 + 6144 * 6144 + 2 * 24576 * 6144 + 2 * 6144)
    assert params == 3_623_976_960
    assert est.wire_per_step("reduce_scatter") == params * 4 * 7 / 8  # fp32 gradients
    assert est.wire_per_step("all_gather") == k * params * 2 * 7 / 8  # bf16 weights, k gathers
    assert est.count("all_reduce") == 0


def test_gqa_at_p2_by_hand():
    # P=2, B=1, S=8, H=16, a=4, g=2, d=4, F=32, fp32: N = 8*16*4 = 512 B, r = 1/2
    cfg = StepConfig(scheme="ulysses", sp_size=2, layers=1, batch=1, seq=8, hidden=16, heads=4, kv_heads=2, ffn=32)
    est = estimate_comm(cfg)
    a2a = [c for c in est.collectives if c.kind == "all_to_all"]
    assert [c.in_bytes for c in a2a[:4]] == [1 * 4 * 4 * 4 * 4, 1 * 4 * 2 * 4 * 4, 1 * 4 * 2 * 4 * 4, 256]
    assert est.wire_per_step("all_to_all") == 2 * (2 + 2 * 2 / 4) * 512 * 0.5 / 2  # SPEC: 2(2+2g/a) N r / P
    # all weights replicated: qkv (4+4)*4*16 + proj 16*16 + MLP 2*32*16 + norms 2*16 = 1824 fp32
    (ar,) = [c for c in est.collectives if c.kind == "all_reduce"]
    assert ar.in_bytes == 1824 * 4 and ar.wire_bytes == 2 * 1824 * 4 * 0.5


def test_gqa_below_p_megatron_adds_last_dim_pair():
    cfg = StepConfig(scheme="megatron", sp_size=8, kv_heads=2)  # a=16, g=2 < P
    est = estimate_comm(cfg)
    last = [c for c in est.collectives if "last dim" in c.what]
    assert [(c.phase, c.kind) for c in last] == [("forward", "all_gather"), ("backward", "reduce_scatter")]
    width = (16 + 4) * 6
    assert last[0].out_shape == (width, 2, 128) and last[0].in_shape == (width // 8, 2, 128)


def test_reference_defaults_match_the_traced_counts():
    cfg = StepConfig()  # sptrace profile's defaults, L = 2
    counts = {s: estimate_comm(cfg.replace(scheme=s)) for s in ("megatron", "ulysses", "hybrid")}
    assert counts["megatron"].count("all_gather") == 12 and counts["megatron"].count("reduce_scatter") == 8
    assert counts["ulysses"].count("all_to_all") == 16 and counts["ulysses"].count("all_reduce") == 1
    hybrid = counts["hybrid"]
    assert (hybrid.count("all_to_all"), hybrid.count("all_gather"), hybrid.count("reduce_scatter")) == (16, 6, 4)
    # ulysses' single fp32 bucket holds every weight: 2 layers x 58560
    (ar,) = [c for c in counts["ulysses"].collectives if c.kind == "all_reduce"]
    assert ar.in_shape == (2 * 58560,)


def test_wire_conventions():
    assert wire_bytes("all_gather", 10, 80, 8) == 70
    assert wire_bytes("reduce_scatter", 80, 10, 8) == 70
    assert wire_bytes("all_to_all", 80, 80, 8) == 70
    assert wire_bytes("all_reduce", 80, 80, 8) == 140
    assert wire_bytes("all_reduce", 80, 80, 1) == 0


def test_korthikanti_table():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert korthikanti_bytes_per_layer("none", seq=s, batch=b, hidden=h, heads=a, tp=t) == sbh * (34 + 5 * a * s / h)
    assert korthikanti_bytes_per_layer("tp_sp_selective", seq=s, batch=b, hidden=h, heads=a, tp=t) == 34 * sbh / t
    assert korthikanti_bytes_per_layer("full_recompute", seq=s, batch=b, hidden=h, heads=a, tp=t) == 2 * sbh
    assert korthikanti_bytes_per_layer("tp_sp", seq=s, batch=b, hidden=h, heads=a, tp=t) == pytest.approx(
        korthikanti_bytes_per_layer("none", seq=s, batch=b, hidden=h, heads=a, tp=t) / t
    )


def test_model_cli_text_and_json(capsys):
    assert main(["model", "--scheme", "megatron", "--preset", "seed-attention"]) == 0
    out = capsys.readouterr().out
    assert "(1120.00 MiB)" in out and "all-gather of the SAVED input shard" in out
    assert main(["model", "--scheme", "ulysses-zero3", "--preset", "seed-3.6b", "--k", "1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert round(data["wire_bytes_per_step"] / GiB, 2) == 38.72 and data["k"] == 1
    assert data["by_kind"]["all_to_all"]["count"] == 64
    # Korthikanti's fp16 figure (2 bytes an element, 1-byte dropout masks), and the same scaled to
    # the declared dtype: fp32 doubles it, in the JSON as in the text
    shape = ["--scheme", "megatron", "--layers", "1", "--batch", "1", "--seq", "2048", "--hidden", "12288",
             "--heads", "96", "--ffn", "49152", "--sp", "8"]  # fmt: skip
    sbh = 2048 * 12288
    assert main(["model", *shape, "--dtype", "float32", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["korthikanti_bytes_per_layer_fp16"]["tp_sp_selective"] == 34 * sbh / 8
    assert data["korthikanti_bytes_per_layer"]["tp_sp_selective"] == 2 * 34 * sbh // 8
    assert main(["model", *shape, "--dtype", "float32"]) == 0
    assert f"with selective recompute of core attention: {2 * 34 * sbh // 8 / 2**20:.2f} MiB" in capsys.readouterr().out
    flags = ["--sp", "4", "--heads", "8", "--kv-heads", "2", "--hidden", "64"]
    # nothing is filled in from the reference models' defaults unless asked for by name
    assert main(["model", "--scheme", "hybrid", *flags]) == 2
    assert "--layers, --batch, --seq, --ffn, --dtype" in capsys.readouterr().err
    assert main(["model", "--scheme", "hybrid", "--preset", "reference", *flags]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--scheme", "zigzag"], "invalid choice: 'zigzag'"),
        (
            ["--scheme", "ulysses", "--preset", "reference", "--heads", "12", "--kv-heads", "12"],
            "heads 12 is not divisible by the sequence-parallel size 8",
        ),
        (["--scheme", "ulysses", "--hidden", "64"], "needs --sp, --layers, --batch, --seq, --heads"),
        (["--scheme", "ulysses-zero3", "--k", "3"], "--k must be 1 or 2"),
    ],
)
def test_model_cli_bad_flags(capsys, flags, message):
    assert main(["model", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
