"""GIVEN pairs of small committed runs (2 ranks each: tests/golden/runs/ and tests/diff/runs/, all
profiled with the same model but for what the pair changes; run.json records each run's
configuration and the fault the reference model injected, and where)
WHEN `sptrace diff BASE NEW` compares them
THEN it names what the change did: the module that began keeping a full-size tensor (the one the
fault generator says it put there), the collectives added, removed or resized by layer, phase and
kind, the shape change before anything else, and it exits 1 on a regression, 0 otherwise; a run
against itself reports no change at all.

tests/diff/runs/ was profiled with `sptrace profile --matrix tests/diff/runs/matrix.json --out DIR
--warmup 1`, and matrix-repeat.json (two clean runs back to back, in one launch of their own);
each run's rank*.pt.trace.json.gz and run.json copied. Both have the defaults the golden runs have
(tests/golden/make_golden.py's RUNS_MATRIX).

Expected values come from run.json (the generator's record of its fault and the declared shape)
and from the tensors' own sizes (B x S/P x H elements), never from sptrace's cost model."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from sptrace.cli import main
from sptrace.vocab import markers
from tests.golden.make_golden import corpus_runs, reference_runs

HERE = Path(__file__).resolve().parent
GOLDEN = {name: path for name, path in reference_runs().items()}
MORE = {p.name: p for p in sorted((HERE / "runs").iterdir()) if p.is_dir()}
RUNS = {**GOLDEN, **MORE}


def config(name: str) -> dict:
    return json.loads((RUNS[name] / "run.json").read_text())["config"]


def diff(base: str | Path, new: str | Path, cache: Path, *flags: str, capsys) -> tuple[int, dict]:
    base = RUNS.get(base, base) if isinstance(base, str) else base
    new = RUNS.get(new, new) if isinstance(new, str) else new
    code = main(["diff", str(base), str(new), "--format", "json", "--cache-dir", str(cache), *flags])
    out = capsys.readouterr().out
    return code, json.loads(out)


def changes(report: dict) -> dict[tuple, dict]:
    return {(c["phase"], c["layer"], c["kind"]): c for c in report["communication"]}


def test_a_stray_full_save_is_named_where_the_generator_put_it(private_cache, capsys):
    code, report = diff("megatron", "megatron-stray-full-save", private_cache, capsys=capsys)
    planted = config("megatron-stray-full-save")["fault_modules"]
    assert code == 1 and report["regression"]
    full = [k for k in report["retained"] if k["became_full"]]
    assert [k["module"] for k in full] == planted
    assert all(k["new"]["layer"] == int(m.split(".")[1]) for k, m in zip(full, planted))
    b, s, h = (config("megatron")[k] for k in ("batch", "seq", "hidden"))
    shapes = [json.loads(text[: text.index("]") + 1]) for k in full for text in k["new"]["full_shapes"]]
    assert shapes and all(shape in ([b * s, h], [b, s, h]) for shape in shapes)  # the whole sequence
    # the fault saves the gathered input instead of gathering it again in backward: one re-gather
    # fewer there, and nothing else about communication changed
    (key, change), *rest = changes(report).items()
    assert not rest and key == ("backward", 0, "all_gather") and change["changed"] == ["count"]
    assert change["new"]["count"] == change["base"]["count"] - 1
    # the text says it first, with the module
    main(["diff", str(RUNS["megatron"]), str(RUNS["megatron-stray-full-save"]), "--cache-dir", str(private_cache)])
    text = capsys.readouterr().out.splitlines()
    headline = next(line for line in text if line and not line.startswith(("sptrace diff", "run.json")))
    assert headline.startswith(f"NEW FULL-SIZE SAVE {planted[0]}:")
    assert text[-1].startswith("REGRESSION:") and planted[0] in text[-1]


def test_a_missing_reduce_scatter_is_an_all_reduce_in_its_layer(private_cache, capsys):
    code, report = diff("megatron", "megatron-missing-reduce-scatter", private_cache, capsys=capsys)
    planted = config("megatron-missing-reduce-scatter")["fault_modules"]  # the MLP left out of SP
    layer = int(planted[0].split(".")[1])
    assert code == 1
    found = changes(report)
    added = {key for key, c in found.items() if c["changed"] == ["added"]}
    assert added and all(kind == "all_reduce" and lay == layer for _, lay, kind in added)
    fewer = found[("forward", layer, "reduce_scatter")]
    assert fewer["new"]["count"] < fewer["base"]["count"]
    # its replicated residual is kept whole: the planted module among the new full-size saves
    full = {k["module"] for k in report["retained"] if k["became_full"]}
    assert set(planted) <= full and all(m.startswith(f"layers.{layer}.") for m in full)


def test_a_debug_hook_that_gathers_is_a_full_save_and_an_all_gather_in_its_layer(private_cache, capsys):
    cfg = config("megatron-debug-hook")
    code, report = diff("megatron", "megatron-debug-hook", private_cache, capsys=capsys)
    assert code == 1
    assert [k["module"] for k in report["retained"] if k["became_full"]] == cfg["fault_modules"]
    (key, change), *rest = changes(report).items()  # the hook's gather of the block's output
    assert not rest and key == ("forward", cfg["fault_layer"], "all_gather") and change["changed"] == ["count"]
    assert change["new"]["count"] == change["base"]["count"] + 1
    # what it keeps is the whole block output, [B, S, H], and its layer keeps more
    full = next(k for k in report["retained"] if k["became_full"])
    assert full["new"]["full_shapes"] == [f"[{cfg['batch']}, {cfg['seq']}, {cfg['hidden']}] float32"]
    layer = next(r for r in report["retained_per_layer"] if r["layer"] == cfg["fault_layer"])
    assert layer["new"] > layer["base"]


def test_zero3_names_the_gathers_and_reduce_scatters_that_replace_the_all_reduce(private_cache, capsys):
    assert config("ulysses-zero3")["zero3"] and not config("ulysses")["zero3"]
    code, report = diff("ulysses", "ulysses-zero3", private_cache, capsys=capsys)
    found = changes(report)
    removed = [key for key, c in found.items() if c["changed"] == ["removed"]]
    added = [key for key, c in found.items() if c["changed"] == ["added"]]
    assert [kind for _, _, kind in removed] == ["all_reduce"]
    assert {kind for _, _, kind in added} == {"all_gather", "reduce_scatter"}
    assert {phase for phase, _, kind in added if kind == "all_gather"} == {"forward", "backward"}
    assert report["config_changes"] == [{"key": "zero3", "base": False, "new": True}]
    # ZeRO-3 moves more bytes than an all-reduce: a regression of bytes, and said so
    assert code == 1 and any("wire bytes" in r for r in report["regressions"])


def test_a_longer_sequence_is_a_shape_change_compared_per_token(private_cache, capsys):
    code, report = diff("megatron", "megatron-seq64", private_cache, capsys=capsys)
    base, new = config("megatron"), config("megatron-seq64")
    assert report["shape_changes"] == [{"field": "seq", "base": base["seq"], "new": new["seq"]}]
    assert report["per_token"] and report["tokens"] == [base["batch"] * base["seq"], new["batch"] * new["seq"]]
    # the sequence collectives move a [B, S/P, H] fp32 shard each: their size from the tensors
    for phase in ("forward", "backward"):
        c = changes(report)[(phase, 0, "all_gather")]
        for side, cfg in (("base", base), ("new", new)):
            each = c[side]["in_bytes"] / c[side]["count"]
            assert each == cfg["batch"] * cfg["seq"] // cfg["sp_size"] * cfg["hidden"] * 4
    assert code == 0 and not report["regressions"]
    # the text says the shape changed before any change it explains
    main(["diff", str(RUNS["megatron"]), str(RUNS["megatron-seq64"]), "--cache-dir", str(private_cache)])
    text = capsys.readouterr().out.splitlines()
    assert text[1] == f"the job changed: seq {base['seq']} -> {new['seq']} (bytes and time compared per token)"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_against_itself_changes_nothing(name, private_cache, capsys):
    code, report = diff(name, name, private_cache, capsys=capsys)
    assert code == 0 and report["same"] and not report["regressions"]
    assert report["communication"] == [] and report["retained"] == [] and report["shape_changes"] == []
    assert all(t["relative"] in (0, None) for t in report["time"]) and report["module_time"] == []


def test_every_corpus_trace_against_itself_changes_nothing(corpus, private_cache, capsys):
    for name, run in corpus_runs(corpus).items():
        code, report = diff(run, run, private_cache, "--skip-bad", capsys=capsys)
        assert code == 0 and report["same"], (name, report["regressions"])


def test_markdown_for_a_pull_request(private_cache, capsys):
    planted = config("megatron-stray-full-save")["fault_modules"][0]
    code = main(["diff", str(RUNS["megatron"]), str(RUNS["megatron-stray-full-save"]), "--format", "markdown",
                 "--cache-dir", str(private_cache)])  # fmt: skip
    md = capsys.readouterr().out
    assert code == 1 and md.startswith("### REGRESSION:")
    assert f"| `{planted}` | 1 |" in md and "| phase | layer | kind | change | count | wire each | wire delta |" in md


def test_what_cannot_be_compared_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "nothing"), str(RUNS["megatron"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing" in err
    assert main(["diff", str(RUNS["megatron"]), str(RUNS["megatron"]), "--time-tolerance", "-1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["diff", str(RUNS["megatron"]), str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json" in err


def junit_cases(xml: str) -> dict[str, str | None]:
    """testcase name -> its failure message (None: passed), from the JUnit XML."""
    from xml.etree import ElementTree

    out = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        failure = case.find("failure")
        out[case.get("name")] = None if failure is None else failure.get("message")
    return out


def test_check_against_a_baseline_fails_the_module_that_began_a_full_size_save(private_cache, capsys):
    planted = config("megatron-stray-full-save")["fault_modules"]
    args = [
        str(RUNS["megatron-stray-full-save"]),
        "--baseline",
        str(RUNS["megatron"]),
        "--cache-dir",
        str(private_cache),
    ]
    assert main(["check", *args, "--format", "junit"]) == 1
    cases = junit_cases(capsys.readouterr().out)
    failed = {name for name, message in cases.items() if message}
    assert failed == set(planted) and "full-size" in cases[planted[0]] and "verdict" in cases
    # a clean repeat of the baseline's job passes, every module a case
    assert main(["check", str(RUNS["megatron-again"]), "--baseline", str(RUNS["megatron"]), "--format", "junit",
                 "--cache-dir", str(private_cache)]) == 0  # fmt: skip
    cases = junit_cases(capsys.readouterr().out)
    assert len(cases) > 5 and not any(cases.values())


def test_analyze_against_a_baseline_fails_the_modules_that_send_more(private_cache, capsys):
    args = ["analyze", str(RUNS["ulysses-zero3"]), "--baseline", str(RUNS["ulysses"]), "--format", "json",
            "--cache-dir", str(private_cache)]  # fmt: skip
    assert main(args) == 1
    report = json.loads(capsys.readouterr().out)
    failed = [m for m in report["modules"] if not m["ok"]]
    assert failed and all("on the wire" in f for m in failed for f in m["failures"])
    # consistent with the diff: the modules that send more issue the collectives ZeRO-3 added
    _, diff_report = diff("ulysses", "ulysses-zero3", private_cache, capsys=capsys)
    added = {m for c in diff_report["communication"] if c["changed"] == ["added"] for m in c["new"]["modules"]}
    assert {m["module"] for m in failed} <= added | {"(no module)"}


def test_a_baseline_gate_that_cannot_compare_communication_is_undecided(corpus, private_cache, capsys):
    run = corpus / "param_dlrm_kineto"  # its collectives record no sizes
    assert main(["check", str(run), "--baseline", str(run), "--cache-dir", str(private_cache)]) == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("CANNOT DECIDE: the collectives of the baseline and the run record no sizes"), last


def _undeclared(run: Path, dst: Path) -> Path:
    """A copy of a committed run whose run.json declares no model (no B, S or H): what a user's
    job without sptrace.profile_step writes."""
    dst.mkdir(parents=True)
    for trace in run.glob("rank*.pt.trace.json.gz"):
        shutil.copy(trace, dst / trace.name)
    return dst


def test_more_bytes_kept_in_a_layer_is_a_regression_without_b_s_h(tmp_path, private_cache, capsys):
    """GIVEN the clean run and the stray-full-save run with no model declared (so no tensor can
    be classed full-size) WHEN diff compares them THEN the layer the fault keeps more in is a
    regression all the same, by bytes alone (the gathered input the fault keeps: B x S x H
    elements more, less the shard the clean layer saves instead), and the baseline gate fails
    the module; a run against itself is no regression."""
    base = _undeclared(RUNS["megatron"], tmp_path / "base")
    new = _undeclared(RUNS["megatron-stray-full-save"], tmp_path / "new")
    code, report = diff(base, new, private_cache, capsys=capsys)
    layer = int(config("megatron-stray-full-save")["fault_modules"][0].split(".")[1])
    assert code == 1 and report["regression"]
    grew = [r for r in report["regressions"] if "keeps more across the forward/backward boundary" in r]
    assert grew and grew[0].startswith(f"layer {layer} ")
    rows = {r["layer"]: (r["base"], r["new"]) for r in report["retained_per_layer"]}
    b, s, h = (config("megatron")[k] for k in ("batch", "seq", "hidden"))
    assert rows[layer][1] - rows[layer][0] >= b * s * h * 4 * (1 - 1 / config("megatron")["sp_size"]) - 1
    main(["diff", str(base), str(new), "--cache-dir", str(private_cache)])
    assert capsys.readouterr().out.splitlines()[-1].startswith("REGRESSION:")
    assert main(["check", str(new), "--baseline", str(base), "--cache-dir", str(private_cache)]) == 1
    assert f"FAIL {config('megatron-stray-full-save')['fault_modules'][0]}" in capsys.readouterr().out
    code, report = diff(base, base, private_cache, capsys=capsys)
    assert code == 0 and not report["regressions"] and not report["undecided"]


def slowed_down(src: Path, dst: Path, module: str, delay_us: float) -> Path:
    """A copy of run ``src`` whose ``module`` takes ``delay_us`` longer in its forward on every
    rank, as if it computed more: its range, and every range around its end, grows by the delay
    and everything that starts at or after its end moves by it. The generator's record: the
    module and the delay."""
    dst.mkdir(parents=True)
    shutil.copy(src / "run.json", dst / "run.json")
    for trace in sorted(src.glob("rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        events = doc["traceEvents"]
        target = next(e for e in events if e.get("ph") == "X" and e.get("name") == markers.MODULE + module)
        end = target["ts"] + target["dur"]
        for e in events:
            ts = e.get("ts")
            if not isinstance(ts, (int, float)):
                continue
            if ts >= end:
                e["ts"] = ts + delay_us
            elif e.get("ph") == "X" and ts + e.get("dur", 0) >= end:
                e["dur"] += delay_us
        (dst / trace.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def test_a_module_made_slower_is_the_largest_time_change(tmp_path, private_cache, capsys):
    module, delay_ms = "layers.0.mlp.fc2", 40.0
    slow = slowed_down(RUNS["megatron-again"], tmp_path / "slow", module, delay_ms * 1e3)
    code, report = diff("megatron-again", slow, private_cache, capsys=capsys)
    largest = report["module_time"][0]
    assert largest["what"] == f"forward {module}" and largest["outside_noise"]
    grew = largest["new_ms"]["median"] - largest["base_ms"]["median"]
    assert abs(grew - delay_ms) < 0.01 * delay_ms
    assert all(abs(t["new_ms"]["median"] - t["base_ms"]["median"]) < 0.01 * delay_ms for t in report["module_time"][1:])
    step = next(t for t in report["time"] if t["what"] == "step")
    assert step["outside_noise"] and code == 1 and any("slower step" in r for r in report["regressions"])


def test_two_clean_runs_back_to_back_are_no_time_regression(private_cache, capsys):
    # profiled one after the other in one launch (tests/diff/runs/matrix-repeat.json)
    code, report = diff("megatron-again", "megatron-repeat", private_cache, capsys=capsys)
    assert code == 0 and not report["regressions"]
    assert report["communication"] == [] and report["shape_changes"] == []


def test_the_diff_page_draws_the_same_comparison(private_cache):
    from plotly.utils import PlotlyJSONEncoder
    from sptrace.dashboards.app import create_app, parse_view
    from sptrace.dashboards.pages import diff as diff_page

    planted = config("megatron-stray-full-save")["fault_modules"][0]
    app = create_app([RUNS["megatron"], RUNS["megatron-stray-full-save"]],
                     options={"load_options": {"cache_dir": private_cache}})  # fmt: skip
    store = app.sptrace_store
    page = json.loads(json.dumps(diff_page.render(store, parse_view(store, "/diff", "?base=0&new=1")),
                                 cls=PlotlyJSONEncoder))  # fmt: skip

    def find(node, pred):
        if isinstance(node, dict):
            if pred(node):
                yield node
            for v in node.values():
                yield from find(v, pred)
        elif isinstance(node, list):
            for v in node:
                yield from find(v, pred)

    def rows(table_id):
        table = next(find(page, lambda n: n.get("props", {}).get("id") == table_id))
        body = next(find(table, lambda n: n.get("type") == "Tbody"))
        return [(r["props"].get("className"), [c["props"]["children"] for c in r["props"]["children"]])
                for r in body["props"]["children"]]  # fmt: skip

    verdict = next(find(page, lambda n: n.get("props", {}).get("id") == "diff-verdict"))["props"]
    assert verdict["title"] == "REGRESSION" and verdict["color"] == "red"
    retained = rows("diff-retained")
    assert retained[0][0] == "diff-worse" and retained[0][1][0] == planted and retained[0][1][3] == "0 -> 1"
    (cls, cells), *rest = rows("diff-comm")
    assert not rest and cls == "diff-better" and cells[:3] == ["backward", "0", "all_gather"]
    # the pair is chosen in the header and kept in the URL; a run the dashboard does not serve is a 404
    client = app.server.test_client()
    layout = client.get("/_dash-layout").data.decode()
    assert '"id": "diff-base"' in layout.replace('"id":"', '"id": "') and "header-diff-wrap" in layout
    assert client.get("/diff?base=1&new=0").status_code == 200
    assert client.get("/diff?base=0&new=7").status_code == 404
