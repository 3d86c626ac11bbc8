from __future__ import annotations

import pytest
from sptrace.reference_models.config import FAULTS, StepConfig

from sptrace.vocab.errors import ConfigError


def test_defaults_avoid_shape_collisions():
    cfg = StepConfig()
    P = cfg.sp_size
    # SPEC.md §5.6: no tensor-parallel shard may look like a full [B, S, H] activation
    assert cfg.ffn // P != cfg.hidden
    assert cfg.heads * cfg.head_dim // P != cfg.hidden
    assert len({cfg.batch, cfg.seq, cfg.seq // P, cfg.hidden, cfg.ffn, cfg.ffn // P}) == 6


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"scheme": "pipeline"}, "unknown scheme 'pipeline'"),
        ({"heads": 12, "kv_heads": 4}, "heads 12 is not divisible by the sequence-parallel size 8"),
        ({"seq": 100}, "seq 100 is not divisible by the sequence-parallel size 8"),
        ({"hidden": 100}, "hidden 100 is not divisible by heads 16"),
        ({"kv_heads": 3}, "heads 16 is not divisible by kv heads 3"),
        ({"sp_size": 4, "heads": 12, "kv_heads": 6, "hidden": 96}, "kv heads 6 and P=4"),
        ({"ffn": 100}, "ffn 100 is not divisible by the tensor-parallel size 8"),
        ({"zero3": True}, "--zero3 applies to ulysses, hybrid, ring and usp"),
        ({"scheme": "ulysses", "fault": "missing-reduce-scatter"}, "needs a tensor-parallel MLP"),
        ({"fault": "stray-full-save", "fault_layer": 2}, "--fault-layer 2 is outside 0..1"),
        ({"fault": "nope"}, "unknown fault 'nope'"),
        ({"dtype": "int8"}, "unknown dtype 'int8'"),
        ({"layers": 0}, "--layers must be >= 1"),
        ({"hidden": 80, "heads": 16}, "head dim 5 (hidden/heads) must be even"),
        ({"scheme": "ring", "seq": 136}, "seq 136 is not divisible by 2P/U = 16 (zigzag)"),
        ({"scheme": "usp", "ulysses_degree": 3}, "--ulysses-degree 3 does not divide the sequence-parallel size 8"),
        ({"scheme": "usp", "ulysses_degree": 8, "heads": 12, "kv_heads": 4}, "heads 12 is not divisible by the Ul"),
        ({"scheme": "ring", "fault": "missing-reduce-scatter"}, "needs a tensor-parallel MLP"),
    ],
)
def test_invalid_configs_say_why(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StepConfig(**changes)


def test_ulysses_allows_ffn_not_divisible_by_p_and_roundtrips():
    cfg = StepConfig(scheme="ulysses", ffn=100, fault="debug-hook")
    assert cfg.faulty_layer == cfg.layers - 1
    assert StepConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown step config keys: bogus"):
        StepConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_every_fault_is_described():
    assert set(FAULTS) == {"stray-full-save", "missing-reduce-scatter", "debug-hook"}
    assert all(len(text) > 40 for text in FAULTS.values())


def test_model_shape_knows_only_what_was_declared():
    from sptrace.vocab.errors import UsageError
    from sptrace.vocab.shape import ModelShape

    # GIVEN a user's run.json that declares B, S, H, a and P (no F, no dtype)
    declared = {"scheme": "megatron", "batch": 1, "seq": 32768, "hidden": 4096, "heads": 32, "sp_size": 8, "x": 1}
    shape = ModelShape.from_mapping(declared, "run.json")
    # THEN F and the dtype are unknown, never a reference model's default
    assert shape.ffn is None and shape.dtype is None and shape.kv_heads is None and shape.zero3 is False
    assert shape.provenance["seq"] == "run.json" and "x" not in shape.to_dict()
    with pytest.raises(UsageError, match="the cost model needs --kv-heads, --ffn, --dtype"):
        shape.require(("kv_heads", "ffn", "dtype"), "the cost model")
    # AND a flag declares a value, saying so
    flagged = shape.override("flags", ffn=16384, scheme="ulysses-zero3")
    assert (flagged.ffn, flagged.scheme, flagged.zero3) == (16384, "ulysses", True)
    assert flagged.provenance["ffn"] == "--ffn" and flagged.describe().endswith("F=16384 ?")
    # the reference models declare every value
    assert not StepConfig().shape().missing(("ffn", "dtype", "kv_heads", "layers", "recompute"))
    with pytest.raises(UsageError, match="--seq must be a positive integer"):
        ModelShape(seq=0)
