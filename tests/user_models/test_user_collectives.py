"""GIVEN models written the way users write them (PyTorch-native TP+SP, raw functional
collectives, list collectives, a P2P ring, two 4-rank TP groups in an 8-rank job), profiled with
plain torch.profiler and no sptrace markers
WHEN sptrace detects their collectives
THEN kinds, counts, bytes, dtypes, groups and peers are those of an independent oracle: torch's
CommDebugMode counts and the shapes of the models' own tensors."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

import sptrace
from sptrace.cli import main
from sptrace.reduce.matching import match_collectives
from sptrace.reduce.peers import detect_run_collectives

pytestmark = pytest.mark.distributed
WORLD = 8
FP32 = 4


def oracle(root, name, rank=0):
    return json.loads((root / "oracle" / name / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def frames(user_runs, private_cache):
    cache = private_cache
    out = {}
    names = ("tp_sp_native", "functional_ulysses", "list_allgather", "p2p_ring", "ffn4h_p4", "forward_only")
    for name in (*names, "ring_isend", "pp2_sp4"):
        run = sptrace.load_run(user_runs / name, cache_dir=cache, workers=1)
        out[name] = detect_run_collectives(run)
    return out


def fwd_bwd(frame):
    return frame[frame["phase"].isin(["forward", "backward"])]


def per_rank_counts(frame):
    return {r: g["kind"].value_counts().to_dict() for r, g in fwd_bwd(frame).groupby("rank")}


def test_functional_collectives_of_dtensor_tp_sp(user_runs, frames):
    frame = frames["tp_sp_native"]
    o = oracle(user_runs, "tp_sp_native")
    expected = {"all_gather": o["comm_counts"]["c10d_functional.all_gather_into_tensor"],
                "reduce_scatter": o["comm_counts"]["c10d_functional.reduce_scatter_tensor"]}  # fmt: skip
    assert per_rank_counts(frame) == {r: expected for r in range(WORLD)}
    ag = fwd_bwd(frame)[fwd_bwd(frame)["kind"] == "all_gather"]
    # the output is the gathered tensor, not the input (the functional op records only its input)
    assert set(ag["in_bytes"]) == {math.prod(o["tensors"]["all_gather"]["in"]) * FP32}
    assert set(ag["out_bytes"]) == {math.prod(o["tensors"]["all_gather"]["out"]) * FP32}
    rs = fwd_bwd(frame)[fwd_bwd(frame)["kind"] == "reduce_scatter"]
    assert set(rs["out_bytes"]) == set(ag["in_bytes"]) and set(rs["in_bytes"]) == set(ag["out_bytes"])
    assert set(frame["group_size"]) == {WORLD} and set(frame["dtype"]) == {"float32"}
    assert ag["source"].str.contains("all_gather_into_tensor arguments").all()
    # one row per collective, each with its transfer (the gloo worker that moved the data)
    assert frame["transfer_dur_us"].notna().all()
    assert frame["layer"].dropna().astype(int).isin([0, 1]).all() and set(ag["layer"]) == {0, 1}


def test_raw_functional_ulysses_and_uneven_all_to_all(user_runs, frames):
    frame = frames["functional_ulysses"]
    for rank in range(WORLD):
        o = oracle(user_runs, "functional_ulysses", rank)
        mine = frame[frame["rank"] == rank]
        counts = mine["kind"].value_counts().to_dict()
        assert counts == {"all_to_all": o["comm_counts"]["c10d_functional.all_to_all_single"],
                          "all_reduce": o["comm_counts"]["c10d_functional.all_reduce"]}  # fmt: skip
        a2a = mine[mine["kind"] == "all_to_all"]
        even = a2a[a2a["in_bytes"] == a2a["out_bytes"]]
        assert set(even["in_bytes"]) == {o["tensors"]["all_to_all"]["elements"] * FP32} and len(even) == 16
        (uneven,) = a2a[a2a["in_bytes"] != a2a["out_bytes"]].itertuples()
        v = o["tensors"]["all_to_all_v"]
        assert (uneven.in_bytes, uneven.out_bytes) == (v["in_elements"] * FP32, v["out_elements"] * FP32)
        assert set(mine[mine["kind"] == "all_reduce"]["in_bytes"]) == {o["tensors"]["all_reduce"]["elements"] * FP32}


def test_list_all_gather_and_its_backward_scatters(user_runs, frames):
    frame = frames["list_allgather"]
    o = oracle(user_runs, "list_allgather")
    counts = o["comm_counts"]
    assert per_rank_counts(frame) == {
        r: {"all_gather": counts["c10d.allgather_"], "scatter": counts["c10d.scatter_"]} for r in range(WORLD)
    }
    chunk = o["tensors"]["all_gather"]["in_elements"] * FP32
    ag = frame[frame["kind"] == "all_gather"]
    assert set(ag["in_bytes"]) == {chunk} and set(ag["out_bytes"]) == {chunk * WORLD}  # out = P x in
    assert set(ag["group_size"]) == {WORLD} and set(ag["dtype"]) == {"float32"}
    sc = frame[frame["kind"] == "scatter"]
    assert sc["dtype"].eq("float32").all() and sc["unknown"].isna().all()  # non-roots: dtype from the root
    assert set(sc["out_bytes"]) == {chunk}
    # each of the P scatters of a backward has one root, which sends the P chunks
    for rank in range(WORLD):
        mine = sc[sc["rank"] == rank]
        assert sorted(mine["in_bytes"].tolist()) == sorted([0] * 14 + [chunk * WORLD] * 2)
    assert sc["wire_bytes"].sum() == pytest.approx(2 * WORLD * chunk * (WORLD - 1))


def test_point_to_point_ring(user_runs, frames):
    frame = frames["p2p_ring"]
    for rank in range(WORLD):
        t = oracle(user_runs, "p2p_ring", rank)["tensors"]
        mine = frame[frame["rank"] == rank]
        for kind in ("send", "recv"):
            rows = mine[mine["kind"] == kind]
            assert len(rows) == t[kind]["count"] and set(rows["peer"]) == {t[kind]["peer"]}
            assert set(rows["in_bytes"]) == {t[kind]["elements"] * FP32}
        assert mine[mine["kind"] == "send"]["wire_bytes"].sum() == t["send"]["count"] * t["send"]["elements"] * FP32
    m = match_collectives(frame)
    assert len(m.matched) == WORLD * (WORLD - 1) and m.unmatched == 0
    assert (m.matched["n_ranks"] == 2).all()


def test_group_size_from_the_data_not_the_world(user_runs, frames):
    # GIVEN two tensor-parallel groups of 4 and data-parallel groups of 2 in an 8-rank job
    frame = frames["ffn4h_p4"]
    o = oracle(user_runs, "ffn4h_p4")
    tp = o["tensors"]["all_gather"]["group"]
    ag = frame[frame["kind"].isin(["all_gather", "reduce_scatter"])]
    # THEN the sequence collectives are 4-rank, read from their out/in ratio
    assert set(ag["group_size"]) == {tp} and ag["source"].str.contains("out/in ratio").all()
    assert set(ag["in_bytes"][ag["kind"] == "all_gather"]) == {math.prod(o["tensors"]["all_gather"]["in"]) * FP32}
    # AND the data-parallel all-reduces, whose group the trace does not name, stay unknown: never 8
    ar = frame[frame["kind"] == "all_reduce"]
    assert len(ar) and ar["group_size"].isna().all() and ar["wire_bytes"].isna().all()
    assert ar["unknown"].str.contains("group size").all()
    assert ar["in_bytes"].notna().all()  # its bytes are known


def test_forward_only_window_has_no_backward(frames):
    frame = frames["forward_only"]
    assert set(frame["phase"]) == {"forward"}


def test_analyze_names_the_missing_regather_of_native_tp(user_runs, capsys, tmp_path):
    # PyTorch-native ColwiseParallel keeps the gathered input instead of re-gathering its shard in
    # backward: against Megatron's model, every column-parallel linear misses that all-gather
    flags = ["--scheme", "megatron", "--layers", "2", "--batch", "2", "--seq", "64", "--hidden", "48", "--heads", "8",
             "--kv-heads", "8", "--ffn", "192", "--dtype", "float32", "--cache-dir", str(tmp_path),
             "--workers", "1"]  # fmt: skip
    code = main(["analyze", str(user_runs / "tp_sp_native"), "--format", "json", *flags])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["verdict"]["status"] == "fail"
    missing = [f for f in out["findings"] if f["code"] == "missing-collective" and "all_gather" in f["message"]]
    assert {f["layer"] for f in missing} == {0, 1}
    assert all(f["ranks"] == list(range(WORLD)) for f in missing)  # one finding, every rank
    assert len(out["findings"]) == len({(f["code"], f["message"]) for f in out["findings"]})
    assert main(["analyze", str(user_runs / "tp_sp_native"), *flags]) == 1
    text = capsys.readouterr().out
    # the shard the backward should re-gather: B x S/P x H x 4 bytes = 2 x 8 x 48 x 4 = 3 KiB
    assert "ranks 0-7: layer 1 backward: missing all_gather of 3.00 KiB" in text


def test_collectives_cli_never_prints_a_size_it_does_not_know(user_runs, capsys, tmp_path):
    assert main(["collectives", str(user_runs / "ffn4h_p4"), "--format", "csv", "--cache-dir", str(tmp_path)]) == 0
    from io import StringIO

    frame = pd.read_csv(StringIO(capsys.readouterr().out))
    assert not (frame[["in_bytes", "out_bytes", "wire_bytes", "group_size"]] == -1).any().any()
    assert frame.loc[frame["kind"] == "all_reduce", "wire_bytes"].isna().all()


def test_analyze_without_a_model_finds_correct_models_consistent(user_runs, capsys, tmp_path):
    # GIVEN correct models, no declared model of the job, and collectives whose size differs by
    # rank by design: an uneven all-to-all, and scatters whose root holds the whole list
    for name in ("tp_sp_native", "functional_ulysses", "list_allgather", "p2p_ring", "ffn4h_p4"):
        code = main(["analyze", str(user_runs / name), "--format", "json", "--cache-dir", str(tmp_path)])
        report = json.loads(capsys.readouterr().out)
        # THEN the ranks agree, and the cost model was skipped, saying why
        assert code == 0 and report["verdict"]["label"] == "CONSISTENT", (name, report["findings"])
        assert "needs --scheme" in report["cost_model"]["skipped"]
        if name in ("functional_ulysses", "list_allgather"):
            # every collective the oracle counted is matched across ranks, the uneven ones included
            assert report["matched"] == sum(oracle(user_runs, name)["comm_counts"].values()), name


def test_ring_attention_with_isend_irecv_in_a_subgroup(user_runs, frames):
    """GIVEN ring attention written with plain dist.isend / dist.irecv over two rings of four
    ranks (even and odd), whose traces name the peer by its rank in a group they do not name
    THEN each rank's sends and receives, per phase, have the global peers and the bytes the
    wrapped torch.distributed calls saw, and every send pairs with its receive."""
    from sptrace.reduce.p2p import analyse_point_to_point

    frame = fwd_bwd(frames["ring_isend"])
    for rank in range(WORLD):
        o = oracle(user_runs, "ring_isend", rank)
        mine = frame[frame["rank"] == rank]
        for phase in ("forward", "backward"):
            for op, kind in (("isend", "send"), ("irecv", "recv")):
                want = sorted((c["peer"], c["bytes"]) for c in o["p2p"][phase] if c["op"] == op)
                rows = mine[(mine["kind"] == kind) & (mine["phase"] == phase)]
                got = sorted(zip(rows["peer"].astype(int), rows["in_bytes"].astype(int)))
                assert got == want, (rank, phase, kind)
    report = analyse_point_to_point(frame)
    sends = sum(1 for r in range(WORLD) for ph in ("forward", "backward")
                for c in oracle(user_runs, "ring_isend", r)["p2p"][ph] if c["op"] == "isend")  # fmt: skip
    assert len(report.pairs) == sends and report.unpaired.empty
    assert not report.pairs["peer_disagrees"].any()
    # each pair stays inside its ring: even ranks with even ranks
    assert ((report.pairs["src"] % 2) == (report.pairs["dst"] % 2)).all()
    # forward: P-1 = 3 steps per ring, each with one hop per rank of both rings
    fwd = report.steps[report.steps["phase"] == "forward"]
    assert list(fwd["step"]) == [0, 1, 2] and set(fwd["hops"]) == {WORLD}


def test_pipeline_stages_of_sequence_parallel_groups(user_runs, frames, capsys, tmp_path):
    """GIVEN two pipeline stages of four SP ranks (SP groups [0-3], [4-7]; stage pairs [r, r+4])
    whose sends and receives name their peer by its rank in the pair's group, which the op does
    not record, and whose stage-0 gradient receive runs before stage 0's backward
    THEN every send and receive has the global peer, the bytes and the autograd work (forward
    activations, backward gradients) of the wrapped calls, every send pairs with its receive, the
    SP collectives stay in the stage's group, and analyze finds the ranks CONSISTENT."""
    from sptrace.reduce.p2p import analyse_point_to_point

    frame = fwd_bwd(frames["pp2_sp4"])
    for rank in range(WORLD):
        o = oracle(user_runs, "pp2_sp4", rank)
        mine = frame[frame["rank"] == rank]
        for kind in ("send", "recv"):
            want = sorted((c["phase"], c["peer"], c["bytes"]) for c in o["p2p"] if c["op"] == kind)
            rows = mine[mine["kind"] == kind]
            got = sorted(zip(rows["phase"], rows["peer"].astype(int), rows["in_bytes"].astype(int)))
            assert got == want, (rank, kind, got, want)
        sp = mine[~mine["kind"].isin(["send", "recv"])]
        assert len(sp) and (sp["group_size"] == len(o["sp_group"])).all(), rank
    # the commands merge the ranks the same way: `sptrace collectives` puts each receive in its
    # autograd work too (the stage-0 gradient receive in backward)
    assert main(["collectives", str(user_runs / "pp2_sp4"), "--format", "json", "--cache-dir", str(tmp_path)]) == 0
    listed = fwd_bwd(pd.DataFrame(json.loads(capsys.readouterr().out)))
    for rank in range(WORLD):
        want = sorted((c["phase"], c["peer"], c["bytes"]) for c in oracle(user_runs, "pp2_sp4", rank)["p2p"]
                      if c["op"] == "recv")  # fmt: skip
        rows = listed[(listed["rank"] == rank) & (listed["kind"] == "recv")]
        assert sorted(zip(rows["phase"], rows["peer"].astype(int), rows["in_bytes"].astype(int))) == want, rank
    report = analyse_point_to_point(frame)
    assert len(report.pairs) == sum(len([c for c in oracle(user_runs, "pp2_sp4", r)["p2p"] if c["op"] == "send"])
                                    for r in range(WORLD)) and report.unpaired.empty  # fmt: skip
    code = main(["analyze", str(user_runs / "pp2_sp4"), "--format", "json", "--cache-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verdict"]["label"] == "CONSISTENT", out["findings"]
