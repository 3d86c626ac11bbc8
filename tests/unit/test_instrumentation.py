"""sptrace.instrument / phase / profile_step on a plain single-process model."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import sptrace
from sptrace.instrumentation import Instrumentation
from sptrace.vocab.markers import SavedTensor


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 20, bias=False)
        self.block = nn.Sequential(nn.GELU(), nn.Linear(20, 12, bias=False))

    def forward(self, x):
        return self.block(self.fc1(x))


def _profiled_names(fn) -> Counter:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return Counter(e.name for e in prof.events())


def test_markers_and_saved_records_while_profiling():
    model = Tiny()
    sptrace.instrument(model)
    x = torch.randn(3, 5, 12)

    def step():
        with sptrace.phase("forward"):
            out = model(x)
        with sptrace.phase("backward"):
            out.sum().backward()

    names = _profiled_names(step)
    for module in ("<root>", "fc1", "block", "block.0", "block.1"):
        assert names[f"sptrace.module::{module}"] == 1
    assert names["sptrace.phase::forward"] == names["sptrace.phase::backward"] == 1
    # one event for the forward's records, written in bulk when the root module returns
    assert sum(v for n, v in names.items() if n.startswith("sptrace.saved::")) == 1
    saved = [r for n in names if n.startswith("sptrace.saved::") for r in SavedTensor.all_from_marker(n)]
    by_module = {(r.module, r.shape, r.kind) for r in saved}
    assert ("fc1", (15, 12), "input") in by_module  # x, flattened by the matmul
    assert ("block.1", (20, 12), "param") in by_module  # W.t(), for the input gradient
    assert ("block.0", (3, 5, 20), "activation") in by_module  # GeLU input
    assert ("block.1", (15, 20), "activation") in by_module
    gelu_in = next(r for r in saved if r.module == "block.0")
    assert gelu_in.nbytes == gelu_in.storage_nbytes == 3 * 5 * 20 * 4


def test_costs_nothing_when_no_profiler_runs(monkeypatch):
    model = Tiny()
    inst = sptrace.instrument(model)
    calls = []
    monkeypatch.setattr(Instrumentation, "_pack", lambda self, t: calls.append(t) or t)
    model(torch.randn(2, 3, 12)).sum().backward()
    assert calls == []  # no saved_tensors_hooks were even installed
    assert inst._stack == []


def test_remove_and_exception_safety():
    model = Tiny()
    inst = sptrace.instrument(model)

    class Boom(Exception):
        pass

    def failing_forward(module, args):
        raise Boom

    handle = model.block[1].register_forward_pre_hook(failing_forward)
    with profile(activities=[ProfilerActivity.CPU]):
        with pytest.raises(Boom):
            model(torch.randn(2, 12))
    assert inst._stack == []  # always_call post-hooks unwound every open range
    handle.remove()
    inst.remove()
    names = _profiled_names(lambda: model(torch.randn(2, 12)).sum().backward())
    assert not any(n.startswith("sptrace.") for n in names)


def test_profile_step_single_process(tmp_path):
    model = Tiny()
    sptrace.instrument(model, prefix="tiny")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def train_step(step):
        seen.append(step)
        with sptrace.phase("forward"):
            loss = model(torch.randn(4, 12)).square().mean()
        with sptrace.phase("backward"):
            loss.backward()
        with sptrace.phase("optimizer"):
            opt.step()
            opt.zero_grad()

    path = sptrace.profile_step(train_step, tmp_path / "run", warmup=3, run_info={"scheme": "custom", "seq": 4})
    assert seen == [0, 1, 2, 3, 4]  # two profiled steps by default: the second decides what one cannot
    assert path == tmp_path / "run" / "rank0.pt.trace.json.gz"
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["world_size"] == 1 and info["backend"] is None and info["profiled_step"] == 3
    assert info["profiled_steps"] == [3, 4]
    assert info["config"] == {"scheme": "custom", "seq": 4}
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    names = Counter(e["name"] for e in events)
    assert names["ProfilerStep#3"] == names["ProfilerStep#4"] == 1
    assert names["sptrace.module::tiny.fc1"] == 2
    assert names["[memory]"] > 0
    assert not list((tmp_path / "run").glob(".*"))  # no temporary files left behind
    # each forward's saved-tensor records survive the export (which drops newlines) as one event,
    # and read back as the tensors autograd saved: what the profiler saw in memory
    saved = [e["name"] for e in events if e["name"].startswith("sptrace.saved::")]
    records = [r for name in saved for r in SavedTensor.all_from_marker(name)]
    assert len(saved) == 2 and len(records) == sum(name.count("sptrace.saved::") for name in saved) >= 8
    assert {(r.module, r.shape) for r in records} >= {("tiny.fc1", (4, 12)), ("tiny.block.0", (4, 20))}


def test_lean_profile_has_no_python_stacks(tmp_path):
    model = Tiny()
    sptrace.instrument(model)

    def train_step(step):
        with sptrace.phase("forward"):
            loss = model(torch.randn(4, 12)).square().mean()
        with sptrace.phase("backward"):
            loss.backward()

    path = sptrace.profile_step(train_step, tmp_path / "run", warmup=1, lean=True)
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert not any(e.get("cat") == "python_function" for e in events)
    assert any(e["name"].startswith("sptrace.saved::") for e in events)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["profiler"]["with_stack"] is False


def test_bulk_records_match_the_readable_description():
    """_flush formats records in bulk (C-level maps); each must equal markers.saved_marker of
    describe_saved for the same tensor, 0-d tensors and views of weights included."""
    from sptrace.instrumentation import _RECORD, describe_saved
    from sptrace.vocab import markers

    scale = nn.Parameter(torch.tensor(0.5))
    weight = nn.Parameter(torch.randn(4, 6))

    class Scaled(nn.Module):
        def forward(self, x):
            return (x @ weight.t()) * scale.exp()  # saves x, W.t() (a view), exp's 0-d result

    model = Scaled()
    x = torch.randn(3, 6, requires_grad=True)  # so that matmul keeps W.t() for x's gradient
    kept: list[torch.Tensor] = []
    inst = sptrace.instrument(model)
    original = Instrumentation._pack
    Instrumentation._pack = lambda self, t: kept.append(t) or original(self, t)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x).sum().backward()
    finally:
        Instrumentation._pack = original
        inst.remove()
    [event] = [e.name for e in prof.events() if e.name.startswith(markers.SAVED)]
    expected = [describe_saved(t, "<root>") for t in kept]
    assert SavedTensor.all_from_marker(event) == expected
    assert {r.shape for r in expected} >= {(), (3, 6), (6, 4)}
    assert {(r.shape, r.kind) for r in expected} >= {((), "activation"), ((6, 4), "param")}
    args = ("m", "3x6", "float32", 72, 0x7F00, 96, "activation")
    assert _RECORD.format(*args) == markers.saved_marker("m", (3, 6), *args[2:])


class _Checkpointed(nn.Module):
    """Blocks under selective activation checkpointing (matmul outputs saved, the rest replayed
    in backward), the whole model checkpointed from outside as well: SAC fails in backward when
    its replay runs other ops than the forward did."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Tiny() for _ in range(2))

    def forward(self, x):
        from functools import partial

        from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

        def policy(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if "mm" in str(op) else CheckpointPolicy.PREFER_RECOMPUTE

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False,
                           context_fn=partial(create_selective_checkpoint_contexts, policy))  # fmt: skip
        return x


@pytest.mark.parametrize("outside", [False, True])
def test_selective_checkpointing_runs_instrumented(outside):
    from functools import partial

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    model = _Checkpointed()
    sptrace.instrument(model)
    x = torch.randn(3, 5, 12, requires_grad=True)

    def forward():
        if not outside:
            return model(x)
        keep = partial(create_selective_checkpoint_contexts, lambda *a, **k: CheckpointPolicy.PREFER_RECOMPUTE)
        return checkpoint(model, x, use_reentrant=False, context_fn=keep)

    forward().sum().backward()  # the warm-up: no profiler
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward().sum().backward()  # raised "invocation index ... not found in storage" before
    names = Counter(e.name for e in prof.events())
    records = [e.name for e in prof.events() if e.name.startswith("sptrace.saved")]
    if outside:
        # the instrumentation's hooks call the outer checkpoint's (instrumenting never turns a
        # user's checkpointing off): the whole model replays in backward, and its forward keeps
        # nothing but the checkpoint's holders, so nothing is recorded as saved
        assert names["sptrace.module::<root>"] == 2 and names["sptrace.module::blocks.1.block"] == 2
        assert not records
        return
    # each block's range in forward and again in its backward replay
    assert names["sptrace.module::blocks.0.fc1"] == 2 and names["sptrace.module::blocks.1.block"] == 2
    # the forward's saves are recorded once; the replay keeps nothing across the boundary
    assert len(records) == 1


def test_layers_from_the_structure_of_module_paths():
    from sptrace.detect.layers import layers_of_paths

    paths = ["0", "0.attn", "0.mlp.0", "0.mlp.1", "1", "1.attn", "layers.3.mlp.0", "head", "mlp.0"]
    layers = layers_of_paths(paths)
    # Sequential(*blocks) children that hold modules are layers; a Sequential MLP's Linears are not
    assert layers == {"0": 0, "0.attn": 0, "0.mlp.0": 0, "0.mlp.1": 0, "1": 1, "1.attn": 1, "layers.3.mlp.0": 3}


class Offloading(nn.Module):
    """Tiny, with fc1's saves offloaded inside the forward (save_on_cpu, as a user writes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.tiny = Tiny()

    def forward(self, x):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            h = self.tiny.fc1(x)
        return self.tiny.block(h)


def _records(fn) -> list[SavedTensor]:
    names = _profiled_names(fn)
    return [r for n in names if n.startswith("sptrace.saved::") for r in SavedTensor.all_from_marker(n)]


def test_offloaded_copies_are_recorded_with_what_they_copy():
    """GIVEN a pack hook that keeps a copy in place of what autograd saves, entered inside the
    forward (over the instrumentation's hooks) or around it (under them), WHEN the instrumented
    model runs under a profiler, THEN each copy is an 'offloaded' record naming the storage it
    copied, the user's hooks still run (the same gradients), and a hook that keeps the tensor
    itself or no tensor (checkpointing's holder) records nothing of the kind."""
    torch.manual_seed(0)
    model, x = Offloading(), torch.randn(3, 5, 12)
    model(x).sum().backward()
    want = model.tiny.fc1.weight.grad.clone()
    model.zero_grad()
    sptrace.instrument(model)
    records = _records(lambda: model(x).sum().backward())
    offloaded = [r for r in records if r.kind == "offloaded"]
    assert ("tiny.fc1", (15, 12)) in {(r.module, r.shape) for r in offloaded}  # x, flattened, copied to the host
    assert all(r.source_ptr and r.source_ptr != r.storage_ptr for r in offloaded)
    assert not any(r.module == "tiny.fc1" and r.kind != "offloaded" and r.shape == (15, 12) for r in records)
    assert torch.equal(model.tiny.fc1.weight.grad, want)  # save_on_cpu still did its job
    # around the whole forward: the instrumentation's hooks run the user's (a copying hook)
    calls = []

    def copying(t):
        calls.append(t.shape)
        return t.clone()

    model.zero_grad()

    def around():
        with torch.autograd.graph.saved_tensors_hooks(copying, lambda t: t):
            model(x).sum().backward()

    outer = _records(around)
    assert calls and {r.kind for r in outer if r.module == "tiny.block.1"} == {"offloaded"}
    assert torch.equal(model.tiny.fc1.weight.grad, want)
    # a hook that keeps the tensor itself copies nothing: plain records
    model.zero_grad()

    def keeping():
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            model.tiny(x).sum().backward()

    assert "offloaded" not in {r.kind for r in _records(keeping) if r.module.startswith("tiny.block")}
