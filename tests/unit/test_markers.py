from __future__ import annotations

import pytest

from sptrace.vocab import markers
from sptrace.vocab.markers import SavedTensor


def test_saved_tensor_marker_roundtrip():
    rec = SavedTensor(
        module="layers.1.mlp.fc1",
        shape=(2, 16, 96),
        dtype="bfloat16",
        nbytes=6144,
        storage_ptr=0x7F00DEAD0000,
        storage_nbytes=8192,
        kind="activation",
    )
    name = rec.to_marker()
    assert name.startswith("sptrace.saved::module=layers.1.mlp.fc1|shape=2x16x96|")
    assert SavedTensor.from_marker(name) == rec
    scalar = SavedTensor("<root>", (), "float32", 4, 1, 4, "activation")
    assert SavedTensor.from_marker(scalar.to_marker()) == scalar


@pytest.mark.parametrize(
    "name",
    [
        "aten::mm",
        "sptrace.saved::module=x",
        "sptrace.saved::module=x|shape=2xZ|dtype=f|bytes=1|ptr=0x1|storage_bytes=1|kind=a",
    ],
)
def test_malformed_saved_markers_are_ignored(name):
    assert SavedTensor.from_marker(name) is None


def test_comm_and_phase_names():
    name = markers.comm_name("layers.0.attn", "q::a2a_fwd")
    assert name == "sptrace.comm::layers.0.attn::q::a2a_fwd"
    assert markers.parse_comm(name) == ("layers.0.attn", "q::a2a_fwd")
    assert markers.parse_comm("c10d::allreduce_") is None
    assert markers.phase_name("backward") == "sptrace.phase::backward"
    with pytest.raises(ValueError, match="unknown phase"):
        markers.phase_name("warmup")
