"""GIVEN a model under sptrace.instrument whose forward gathers into a buffer it made (a
one-process gloo group), and keeps that buffer in a list, drops it, or leaves the last reference
to another thread (as gloo's worker thread holds a call's tensors), profiled over a training step
WHEN the backward that consumes the forward ends
THEN the census event says who released the buffer (alive, the model's thread, another thread; a
backend thread that drops its reference late is waited for),
the holder of its allocation follows, and the census changes no tensor's life (the same frees with
it as without it)."""

from __future__ import annotations

import gc
import json
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile

import sptrace
from sptrace import census as census_module
from sptrace.detect.allocations import detect_retained
from sptrace.vocab import markers

N = 4096  # elements of the gathered buffer: large enough to be its own allocation
MODEL_TENSOR_BYTES = 64
"""The smallest free the census test compares: larger than any scalar Python collects at its own time."""


@pytest.fixture(scope="module")
def group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Gathering(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc = nn.Linear(N // 16, N // 16)
        self.how, self.kept, self.handed = how, [], []

    def forward(self, x):
        out = torch.empty(N)
        dist.all_gather_into_tensor(out, x.reshape(-1).contiguous())
        with torch.no_grad():  # a statistic of the gathered sequence: autograd keeps nothing of it
            scale = out.abs().mean()
        y = self.fc(x.view(16, -1)).relu() * scale
        if self.how == "list":
            self.kept.append(out)
        elif self.how == "thread":  # another thread holds the last reference, and drops it later
            ready = threading.Event()
            holder = threading.Thread(target=lambda t=out: (ready.wait(), t.sum()), name="backend-like")
            self.handed.append((holder, ready))
            holder.start()
        return y


def _step(tmp_path, how: str, census: bool = True):
    model = Gathering(how)
    handle = sptrace.instrument(model, census=census)
    x = torch.randn(N)
    # Python's cyclic collector frees whatever a cycle held (a previous test's tensors) when it
    # happens to run: off during the step, so that the same step frees the same tensors every time
    gc.collect()
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
            loss = model(x).square().mean()
            for holder, ready in model.handed:  # the model has let go; the other thread drops it now
                ready.set()
                holder.join()
            loss.backward()
    finally:
        gc.enable()
    handle.remove()
    path = tmp_path / f"rank0-{how}-{census}.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"], path, model


@pytest.mark.parametrize(
    "how, who",
    # dropped: the model lets go when its forward returns, and gloo's worker drops the finished
    # call's work item when it is next scheduled, before or after that: either thread may hold the
    # last reference, and nobody holds it at the boundary
    [("list", {"alive"}), ("dropped", {"model", "backend"}), ("thread", {"backend"})],
)
def test_the_census_says_who_released_the_buffer(group, tmp_path, how, who):
    events, path, model = _step(tmp_path, how)
    (name,) = [e["name"] for e in events if e.get("name", "").startswith(markers.RELEASED)]
    census = markers.ReleasedCensus.from_marker(name)
    assert census is not None
    (released,) = [w for _, n, w in census.entries if n == N * 4]
    assert released in who
    retained = detect_retained(sptrace.load_trace(path, cache=False), element_size=4).tensors
    gathered = retained[retained["collective"] == "c10d::_allgather_base_"]
    if how == "list":  # never freed, and still held when backward ended: the model kept it
        assert list(gathered["holder"]) == ["model"] and "the model kept it" in gathered["evidence"].iloc[0]
        assert gathered["storage_ptr"].iloc[0] == model.kept[0].untyped_storage().data_ptr()
    else:  # released before the boundary: not alive across it, or the backend's
        assert set(gathered["holder"]) <= {"backend"}


def _held_by_a_thread(release_after_s: float) -> tuple[census_module.Watch, threading.Thread]:
    """A watched buffer whose last reference a backend-like thread drops ``release_after_s`` after
    the model's thread has let go (gloo's worker, scheduled late on a loaded machine)."""
    watch = census_module.Watch()
    buffer = torch.empty(N)
    watch.add(buffer)
    holder = threading.Thread(target=lambda t=buffer: time.sleep(release_after_s), name="late-backend")
    holder.start()
    del buffer
    return watch, holder


def test_the_census_waits_for_a_backend_thread_that_is_late():
    watch, holder = _held_by_a_thread(0.01)
    assert watch.held() == 1  # when the census starts, the late thread still holds it
    # a generous wait: it ends when the thread lets go (a loaded machine schedules it late), so
    # what is tested is that the census waits, not how soon a thread runs
    census = watch.census(settle_s=5.0)
    holder.join()
    assert [who for _, n, who in census.entries] == ["backend"]


def test_a_buffer_still_held_after_the_wait_is_alive():
    watch, holder = _held_by_a_thread(0.5)
    started = time.monotonic()
    census = watch.census(settle_s=0.02)
    waited = time.monotonic() - started
    holder.join()
    assert [who for _, n, who in census.entries] == ["alive"] and 0.02 <= waited < 0.4


def test_a_step_with_nothing_held_does_not_wait():
    watch = census_module.Watch()
    buffer = torch.empty(N)
    watch.add(buffer)
    del buffer
    started = time.monotonic()
    census = watch.census(settle_s=5.0)
    assert [who for _, n, who in census.entries] == ["model"] and time.monotonic() - started < 1.0


def test_the_census_changes_no_tensor_life(group, tmp_path):
    # the frees on this (the model's) thread: gloo's thread lets go of a call's tensors when it
    # gets to it, inside the profiled window or after, with or without the census; and the model's
    # tensors only (a scalar of 4 or 8 bytes, such as autograd's or the loss's, is freed when
    # Python's collector gets to it, a run at a time)
    me = threading.get_native_id()

    def frees(events):
        return sorted(e["args"]["Bytes"] for e in events
                      if e.get("name") == "[memory]" and e["args"]["Bytes"] <= -MODEL_TENSOR_BYTES
                      and e["tid"] == me)  # fmt: skip

    with_census, _, _ = _step(tmp_path, "dropped", census=True)
    without, _, _ = _step(tmp_path, "dropped", census=False)
    assert frees(with_census) == frees(without) and len(frees(without)) >= 10
    assert not any(e.get("name", "").startswith(markers.RELEASED) for e in without)


def test_the_collectives_are_unwrapped_with_the_last_instrumentation(group):
    original = dist.all_gather_into_tensor
    first, second = sptrace.instrument(nn.Linear(2, 2)), sptrace.instrument(nn.Linear(2, 2))
    assert dist.all_gather_into_tensor is not original and dist.all_gather_into_tensor._sptrace_watched
    # P2POp checks its op by identity: the point-to-point functions stay what they were
    assert dist.P2POp(dist.irecv, torch.empty(2), 0).op is dist.irecv
    assert not getattr(dist.isend, "_sptrace_watched", False)
    first.remove()
    assert dist.all_gather_into_tensor is not original
    second.remove()
    assert dist.all_gather_into_tensor is original
