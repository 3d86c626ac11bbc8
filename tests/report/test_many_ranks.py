"""GIVEN a 64-rank run (the 8-rank Megatron reference run replicated: 8 jobs' worth of process
groups)
WHEN it is analysed (one rank made late before the reduce), and its Timeline and Collectives pages are drawn
THEN arrival skew is one collectives x ranks figure (each collective's first rank of its group at
0, the late rank late by the delay), the top stragglers lead with the delayed rank, the
Timeline shows one group of 32 lanes at a time (picked in the URL, by default the straggler's),
never 64, and a thousand ranks share columns in the heatmap."""

from __future__ import annotations

import numpy as np
import pytest
from sptrace.dashboards.pages import collectives, timeline
from sptrace.dashboards.pages.common import View
from sptrace.dashboards.store import RunStore

from sptrace.analysis import reduce_run
from sptrace.load.replicate import replicate_run
from sptrace.reduce.matching import skew_by_rank, top_stragglers
from sptrace.report.timeline import skew_heatmap
from sptrace.run.map import MapSpec, map_run

pytestmark = pytest.mark.distributed
LATE_RANK, LATE_AT, DELAY_US = 45, 5, 500_000.0  # half a second, far beyond the run's own skew


@pytest.fixture(scope="module")
def many(profiled, tmp_path_factory):
    return replicate_run(profiled("megatron"), 64, tmp_path_factory.mktemp("many") / "ranks64")


@pytest.fixture(scope="module")
def analysis(many, private_cache):
    """The 64 ranks through the map, then one rank made late before the reduce, as a slow host
    is: rank 45 arrives DELAY_US late at its collective #5; the other ranks of its job wait for
    it there (their transfer lasts DELAY_US longer, so all end together), and the whole job runs
    DELAY_US later from then on."""
    run, results = map_run(many, MapSpec(cache_dir=private_cache))
    job = range(LATE_RANK // 8 * 8, LATE_RANK // 8 * 8 + 8)
    for rank in job:
        f = results[rank].collectives.sort_values("start_us")
        at, after = f.index[LATE_AT], f.index[LATE_AT + 1 :]
        later = f.index[LATE_AT:] if rank == LATE_RANK else after
        f.loc[later, ["start_us", "transfer_start_us"]] += DELAY_US
        if rank != LATE_RANK:
            f.loc[at, "transfer_dur_us"] += DELAY_US
        results[rank].collectives = f
    return reduce_run(run, many, results)


def test_skew_is_collectives_by_ranks(analysis):
    a = analysis
    assert sorted(a.run.ranks) == list(range(64)) and a.run.world_size == 64
    per_rank = a.collectives.groupby("rank").size()
    grid = skew_by_rank(a.matching)
    assert grid.shape == (per_rank.max(), 64) and list(grid.columns) == list(range(64))
    values = grid.to_numpy(dtype=float)
    assert np.nanmin(values) >= 0
    # in every group and collective, the first rank to arrive is at 0
    mem = a.matching.members
    assert (mem.groupby(["group", "key"])["skew_us"].min() == 0).all()
    # 8 copies, each its own groups: a collective is matched once per copy
    assert len(a.matching.matched) == 8 * per_rank.iloc[0]
    # the delayed rank is late by the delay at that collective, and nobody else is nearly as late
    assert grid.loc[LATE_AT, LATE_RANK] == pytest.approx(DELAY_US, rel=0.2)
    assert np.nanmax(grid.drop(columns=[LATE_RANK]).to_numpy(dtype=float)) < 0.5 * DELAY_US


def test_top_stragglers(analysis):
    m = analysis.matching
    top = top_stragglers(m, 10)
    assert len(top) == 10 and int(top["rank"].iloc[0]) == LATE_RANK
    everyone = top_stragglers(m, 1000)
    assert len(everyone) == 64 and sorted(everyone["rank"]) == list(range(64))
    assert everyone["times_last"].sum() == (m.matched["n_ranks"] > 1).sum()
    mine = m.matched[m.matched["straggler"] == LATE_RANK]
    assert top["times_last"].iloc[0] == len(mine)
    assert top["wait_caused_ms"].iloc[0] == pytest.approx(mine["max_wait_us"].sum() / 1e3, abs=1e-3)


def test_heatmap_shares_columns_past_its_width(analysis):
    full = skew_heatmap(analysis)
    assert len(full.data[0].x) == 64 and full.data[0].x[0] == "0"
    narrow = skew_heatmap(analysis, max_columns=16)
    assert list(narrow.data[0].x[:2]) == ["ranks 0-3", "ranks 4-7"] and len(narrow.data[0].x) == 16
    z = np.asarray(narrow.data[0].z, dtype=float)
    assert np.nanmax(z[:, LATE_RANK // 4]) == pytest.approx(np.nanmax(np.asarray(full.data[0].z)[:, LATE_RANK]))


def _components(tree, kind: str) -> list:
    found = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif hasattr(x, "children") or type(x).__name__ == kind:
            if type(x).__name__ == kind:
                found.append(x)
            walk(getattr(x, "children", None))

    walk(tree)
    return found


def test_timeline_shows_a_group_of_lanes_at_a_time(many, analysis):
    store = RunStore([many], analyses=[analysis])
    page = timeline.render(store, View("timeline", 0, None, {}))
    graphs = {g.id: g.figure for g in _components(page, "Graph")}
    assert set(graphs) == {"timeline-graph", "timeline-skew"}
    lanes = graphs["timeline-graph"].layout.yaxis.ticktext
    # by default the group of the rank that kept the others waiting longest
    assert len(lanes) == 32 and f"rank {LATE_RANK}" in lanes and graphs["timeline-graph"].layout.title.text == (
        "ranks 32-63 of 64"
    )  # fmt: skip
    select = next(s for s in _components(page, "Select") if s.id == "timeline-ranks")
    assert [d["label"] for d in select.data] == ["ranks 0-31", "ranks 32-63"] and select.value == "32"
    chosen = timeline.render(store, View("timeline", 0, None, {"ranks": "0"}))
    figure = next(g.figure for g in _components(chosen, "Graph") if g.id == "timeline-graph")
    assert list(figure.layout.yaxis.ticktext) == [f"rank {r}" for r in range(32)]
    grids = [g for g in _components(page, "AgGrid") if g.id["name"] == "timeline-stragglers"]
    assert grids and grids[0].rowData[0]["rank"] == LATE_RANK and len(grids[0].rowData) == 10
    # and the critical path's time by module beside them
    path = [g for g in _components(page, "AgGrid") if g.id["name"] == "critical-path"]
    assert path and path[0].rowData


def test_collectives_page_has_the_skew_section(many, analysis):
    store = RunStore([many], analyses=[analysis])
    page = collectives.render(store, View("collectives", 0, None, {}))
    ids = [g.id for g in _components(page, "Graph")]
    assert "collectives-skew" in ids
    stragglers = [g for g in _components(page, "AgGrid") if g.id["name"] == "collectives-stragglers"]
    assert len(stragglers) == 1 and stragglers[0].rowData[0]["rank"] == LATE_RANK
