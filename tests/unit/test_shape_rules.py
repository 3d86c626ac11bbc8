"""GIVEN the rules that live in one place (S/P and the S % P rule on ModelShape, rows -> JSON)
WHEN each stage that applies them meets a case
THEN every stage says the same: one sentence for an uneven split, null for a missing value."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.checks.sharding import Judge
from sptrace.costmodel.spec import validate
from sptrace.jsonable import records, scalar
from sptrace.vocab.errors import ConfigError, UsageError
from sptrace.vocab.shape import ModelShape, seq_split_problem

UNEVEN = "seq 100 is not divisible by the sequence-parallel size 8"


def test_local_seq_is_known_only_for_an_even_split():
    assert ModelShape(seq=128, sp_size=8).local_seq == 16
    assert ModelShape(seq=128, sp_size=8).seq_split_problem() is None
    assert ModelShape(seq=100, sp_size=8).local_seq is None
    assert ModelShape(seq=100, sp_size=8).seq_split_problem() == UNEVEN
    assert ModelShape(seq=128).local_seq is None and ModelShape(seq=128).seq_split_problem() is None


def test_every_stage_says_the_one_sentence():
    assert seq_split_problem(100, 8) == UNEVEN
    with pytest.raises(ConfigError, match=UNEVEN):  # the reference models, before a launch
        StepConfig(seq=100)
    shape = StepConfig().shape().override("flags", seq=100)
    with pytest.raises(UsageError, match=UNEVEN):  # the cost model
        validate(shape)
    with pytest.raises(ValueError, match=UNEVEN):  # the sharding check's classifier
        Judge(shape)


def test_records_write_every_missing_value_as_null():
    frame = pd.DataFrame({
        "rank": np.array([0, 1]), "bytes": [1.5, np.nan], "layer": pd.array([3, None], dtype="Int64"),
        "shape": [(2, 16, 96), None], "module": ["attn", None],
    })  # fmt: skip
    rows = records(frame)
    assert rows == [
        {"rank": 0, "bytes": 1.5, "layer": 3, "shape": (2, 16, 96), "module": "attn"},
        {"rank": 1, "bytes": None, "layer": None, "shape": None, "module": None},
    ]
    assert all(type(row["rank"]) is int for row in rows)  # numpy's scalars unboxed: 0, not 0.0
    assert json.dumps(rows) == (
        '[{"rank": 0, "bytes": 1.5, "layer": 3, "shape": [2, 16, 96], "module": "attn"}, '
        '{"rank": 1, "bytes": null, "layer": null, "shape": null, "module": null}]'
    )
    assert [scalar(v) for v in (None, pd.NA, float("nan"), np.float64("nan"), 0, "")] == [None] * 4 + [0, ""]
