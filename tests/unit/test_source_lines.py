"""GIVEN Python frames as the profiler's tracer names them and as sptrace.instrument reads them
WHEN sptrace picks the frame that made a tensor
THEN it is the innermost frame of the user's code (not torch's, sptrace's, the standard library's,
or a framework's unless nothing else is on the stack), and instrument's records of those lines
round-trip through the trace's event names."""

from __future__ import annotations

import inspect
import sysconfig

import torch

from sptrace.makers import MakerLines
from sptrace.vocab import markers
from sptrace.vocab.source_lines import SourceLine, frame_kind, maker, parse_tracer_frame


def test_frame_kinds():
    site = sysconfig.get_paths()["purelib"]
    assert frame_kind("torch/nn/modules/module.py") == "library"
    assert frame_kind("contextlib.py") == "library"
    assert frame_kind("sptrace/census.py") == "library"
    assert frame_kind(f"{site}/torch/autograd/function.py") == "library"
    assert frame_kind(inspect.getfile(MakerLines)) == "library"  # sptrace's own, by absolute path
    assert frame_kind("megatron/core/transformer/attention.py") == "framework"
    assert frame_kind(f"{site}/deepspeed/sequence/layer.py") == "framework"
    assert frame_kind("train/model.py") == "user"
    assert frame_kind("/home/me/repo/model.py") == "user"
    assert frame_kind("reference_models/megatron_sp.py") == "user"  # sptrace's reference models are a user's code
    assert frame_kind("<built-in method mm of type object at 0x7f>") == "library"


def test_the_maker_is_the_innermost_user_frame_else_the_frameworks():
    names = ["test_block.py(10): test_it", "torch/nn/modules/module.py(1736): _call_impl",
             "megatron/core/transformer/mlp.py(120): forward", "nn.Module: Linear_0",
             "megatron/core/tensor_parallel/layers.py(400): forward", "<built-in method mm>"]  # fmt: skip
    frames = [f for f in map(parse_tracer_frame, names) if f is not None]
    assert len(frames) == 4 and frames[0] == SourceLine("test_block.py", 10, "test_it", exact=False)
    assert maker(frames) == frames[0]  # the test's call: the user's innermost frame
    assert maker(frames[1:]) == SourceLine("megatron/core/tensor_parallel/layers.py", 400, "forward", False)
    assert maker([frames[1]]) is None


def test_instruments_records_round_trip_through_an_event_name():
    name = " ".join([markers.made_marker(0x7F00, 52, "forward", "dir with space/a@b.py"),
                     markers.made_marker(0x7F80, 9, "<lambda>", "m.py")])  # fmt: skip
    assert markers.made_lines(name) == {
        0x7F00: ("dir with space/a@b.py", 52, "forward"),
        0x7F80: ("m.py", 9, "<lambda>"),
    }
    assert markers.made_lines("sptrace.saved::x") == {} and markers.made_lines(markers.MADE + "zz@1@f@m.py") == {}


def test_the_mode_notes_each_statement_and_the_saves_inside_a_call():
    x = torch.randn(4, 8, requires_grad=True)
    mode = MakerLines()
    with mode:
        y = x * 2.0
        line_y = inspect.currentframe().f_lineno - 1
        view = y[:2]  # a view of y's storage: y's statement made it
        z = torch.nn.functional.dropout(y, p=0.5, training=True)
        line_z = inspect.currentframe().f_lineno - 1
    lines = markers.made_lines(mode.take_marker())
    here = "tests/unit/test_source_lines.py"
    assert lines[y.untyped_storage().data_ptr()] == (
        here,
        line_y,
        "test_the_mode_notes_each_statement_and_the_saves_inside_a_call",
    )
    assert lines[z.untyped_storage().data_ptr()][:2] == (here, line_z)
    assert view.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert mode.take_marker() is None  # taken once
    # a pack hook inside a call (autograd saving dropout's mask) notes the statement running then
    saved = []
    mode = MakerLines()

    def pack(t):
        mode.note_saved(t)
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode:
        torch.nn.functional.dropout(x, p=0.5, training=True)
        line = inspect.currentframe().f_lineno - 1
    mask = [t for t in saved if t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()]  # (float on CPU)
    assert mask and markers.made_lines(mode.take_marker())[mask[0].untyped_storage().data_ptr()][1] == line
