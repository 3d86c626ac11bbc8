"""The text tables: columns as wide as their widest value, never running together."""

from __future__ import annotations

import re

import pandas as pd

from sptrace.cli.collectives import render_table
from sptrace.detect import COLUMNS
from sptrace.detect.timing import RankTiming


def test_the_collectives_table_keeps_columns_apart_and_says_where_time_starts():
    base = {c: None for c in COLUMNS}
    rows = [
        {**base, "rank": 0, "kind": "all_gather", "group": "0", "group_size": 8, "dtype": "bfloat16",
         "in_bytes": 2**30, "out_bytes": 1008 * 2**20, "wire_bytes": 7 * 2**30, "start_us": 5_000.0,
         "transfer_dur_us": 27_576.0, "phase": "forward", "layer": 31, "module": "decoder.layers.31.mlp"},
        {**base, "rank": 0, "kind": "send", "group": "3", "group_size": 2, "peer": 5, "dtype": "float32",
         "in_bytes": 6144, "out_bytes": 0, "wire_bytes": 6144, "start_us": 9_000.0, "phase": "backward"},
    ]  # fmt: skip
    text = render_table(pd.DataFrame(rows), [RankTiming(0, 10.0, 1.0, None, 0, "ProfilerStep#", 1_000.0)])
    lines = text.splitlines()
    assert lines[0] == "start ms: from the rank's step start (ProfilerStep#); xfer ms: transfer time"
    header = re.split(r"\s{2,}", lines[1].strip())
    assert header[:6] == ["rank", "kind", "group", "P", "peer", "dtype"]
    big = re.split(r"\s{2,}", lines[2].strip())
    # every cell apart from its neighbours by at least two spaces, even 1008.00 MiB after 1.00 GiB
    assert big[4:10] == ["bfloat16", "1.00 GiB", "1008.00 MiB", "7.00 GiB", "4.00", "27.58"], big
    send = lines[3]
    assert re.search(r"\bsend\s{2,}3\s{2,}2\s{2,}5\s{2,}float32", send), send  # the peer column
    assert send.split()[-2:] == ["?", "backward"]  # no transfer record: ?, never a number
