"""GIVEN items mapped on local worker processes (sptrace.run.executors.map_ranks)
WHEN they are handed over in batches
THEN every item comes back once, with its own result, whatever the batch size; the batches
shrink so that every worker still gets several; the driver is one of the workers (one process
spawned for two), and every process takes a share."""

from __future__ import annotations

import os

import pytest

from sptrace.run.executors import BATCH_ITEMS, Executor, batch_size, map_ranks


@pytest.mark.parametrize(
    "items, workers, size",
    [(1024, 2, BATCH_ITEMS), (10_000, 16, BATCH_ITEMS), (64, 2, BATCH_ITEMS), (40, 2, 5), (7, 2, 1), (1, 8, 1)],
)
def test_the_batch_size_leaves_several_batches_a_worker(items, workers, size):
    assert batch_size(items, workers) == size


def test_batched_items_come_back_once_each_with_their_own_result():
    items = list(range(-18, 19))  # 37: batches of 4 and a last one of 1
    got = list(map_ranks(abs, items, executor=Executor(workers=2, progress=False)))
    assert sorted(item for item, _ in got) == items
    assert all(result == abs(item) for item, result in got)


def process_of(item: int) -> tuple[int, int]:
    return item, os.getpid()


def test_two_workers_are_this_process_and_one_spawned_each_mapping_a_share():
    items = list(range(64))  # 8 batches of 8: two handed to the spawned process at once, whatever its start
    got = list(map_ranks(process_of, items, executor=Executor(workers=2, progress=False)))
    assert sorted(item for item, _ in got) == items
    assert all(result[0] == item for item, result in got)
    pids = {pid for _, (_, pid) in got}
    assert os.getpid() in pids
    assert len(pids) == 2
    here = {item for item, (_, pid) in got if pid == os.getpid()}
    assert set(range(8)) <= here  # the first batch: the rank sptrace.cli reads ahead is read here
