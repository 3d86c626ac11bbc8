"""GIVEN a stray kept at many boundaries (every step, every micro-batch) of a long window
WHEN the sharding check reports it
THEN it is one finding per rank set that says where it repeats in short ('steps 1-862'), with
every boundary in its JSON, and a rank's kept bytes are the most one boundary held, never a sum."""

from __future__ import annotations

import pandas as pd

from sptrace.checks.sharding_findings import boundaries_text
from sptrace.cli.check import most_kept


def test_where_a_finding_repeats_in_short():
    assert boundaries_text(((1, 0),), "step") == "step 1"
    assert boundaries_text(tuple((s, 0) for s in range(1, 863)), "step") == "steps 1-862"
    assert boundaries_text(((None, 0), (None, 1), (None, 3)), "micro-batch") == "micro-batches 0-1, 3"
    every = tuple((s, m) for s in (1, 2) for m in (0, 1))
    assert boundaries_text(every, "step micro-batch") == "steps 1-2, micro-batches 0-1"
    some = ((1, 0), (1, 1), (2, 1), (3, 0), (4, 1))
    assert boundaries_text(some, "step micro-batch") == (
        "step 1, micro-batch 0; step 1, micro-batch 1; step 2, micro-batch 1 and 2 more"
    )
    assert boundaries_text(((None, 0),), "") == ""


def test_kept_bytes_are_the_largest_boundarys():
    kept = pd.DataFrame({"boundary": ["step 1", "step 1", "step 2", "step 3"], "storage_bytes": [100, 50, 120, 10]})
    assert most_kept(kept) == (150.0, "step 1")
    assert most_kept(kept.iloc[:0]) == (0.0, "")
    one = pd.DataFrame({"boundary": [None, None], "storage_bytes": [7, 8]})
    assert most_kept(one) == (15.0, "")
