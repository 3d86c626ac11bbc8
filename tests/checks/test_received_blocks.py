"""GIVEN a clean ring-attention run at P = 2 with as many kv heads as query heads
(tests/golden/runs/ring-mha, 2 gloo ranks): each rank keeps the K/V block it last received,
[2, B, S/P, g, d], whose element count equals a full [B, S, H] activation's and whose leading 2
(K and V) reads as P chunks of S/P tokens
WHEN `sptrace check` judges it
THEN the block is judged by where it came from, the receive that filled the buffer made for it:
a sequence shard, and the run PASSes; where the trace no longer shows that (an op computing
between the buffer's allocation and the exchange) no receive is claimed for it.

The expected class comes from the block's own shape (its sequence axis holds S/P tokens), not
from sptrace's rule."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from sptrace.cli import main

RUN = Path(__file__).resolve().parents[1] / "golden" / "runs" / "ring-mha"


def check(run: Path, capsys, cache_dir: Path) -> tuple[int, dict]:
    code = main(["check", str(run), "--format", "json", "--cache-dir", str(cache_dir)])
    return code, json.loads(capsys.readouterr().out)


def kv_blocks(report: dict, model: dict) -> list[dict]:
    """The retained tensors shaped [2, B, S/P, g, d]: K and V of S/P tokens, stacked."""
    B, S, P = model["batch"], model["seq"], model["sp_size"]
    return [s for s in report["saved"] if s["shape"] and len(s["shape"]) == 5 and s["shape"][:3] == [2, B, S // P]]


def test_a_received_block_is_a_sequence_shard(capsys, cache_dir):
    model = json.loads((RUN / "run.json").read_text())["config"]
    assert (model["sp_size"], model["kv_heads"]) == (2, model["heads"])  # the coincidence under test
    code, report = check(RUN, capsys, cache_dir)
    blocks = kv_blocks(report, model)
    assert len(blocks) == 2  # one a rank
    for block in blocks:
        elements = 1
        for d in block["shape"]:
            elements *= d
        assert elements == model["batch"] * model["seq"] * model["hidden"]  # a full activation's count
        assert block["class"] == "seq-sharded" and block["origin"] == "received", block
        assert block["producer"] == "c10d::recv_"
    assert code == 0 and report["ok"] and report["counts"]["full"] == 0


def test_no_receive_is_claimed_without_the_exchange_in_the_trace(tmp_path, capsys, cache_dir):
    # an op that computes on the thread between each block's allocation and its exchange: the
    # buffer may then be that op's output, so the receive is not claimed
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    for trace in run.glob("rank*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        events = doc["traceEvents"]
        ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"), key=lambda e: e["ts"])
        first_send = next(i for i, e in enumerate(ops) if e["name"] == "c10d::send")
        made = next(e for e in reversed(ops[:first_send]) if e["name"] == "aten::empty")
        send = ops[first_send]
        gap = send["ts"] - (made["ts"] + made["dur"])
        assert gap > 2
        events.append({**made, "name": "aten::add", "ts": made["ts"] + made["dur"] + gap / 3, "dur": gap / 3,
                       "args": {"Input Dims": [[1], [1], []]}})  # fmt: skip
        trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    model = json.loads((run / "run.json").read_text())["config"]
    _, report = check(run, capsys, cache_dir)
    blocks = kv_blocks(report, model)
    assert len(blocks) == 2 and all(b["origin"] != "received" and b["producer"] is None for b in blocks)
