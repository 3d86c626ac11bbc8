"""The native decoder reads a document in pieces exactly as it reads it whole (sptrace/load/_kineto.c,
``Decoder.feed``): wherever the cuts fall (inside a number, a string, an escape, a UTF-8 sequence,
between a key and its value), the columns, tokens, metadata and declines are the same. And a
cold load goes through the pieces: the trace's text is never read whole on the native path.

Oracle: ``_kineto.decode`` of the whole text, itself held to the msgspec path by test_native.py."""

from __future__ import annotations

import gzip
import json
import os
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sptrace.load import decode, pieces
from sptrace.vocab.errors import TraceError
from tests.load.test_native import DECLINED, NOT_BUILT, events, kineto_trace


@pytest.fixture(autouse=True)
def native():
    if decode._kineto is None:
        if os.environ.get("SPTRACE_REQUIRE_NATIVE"):
            pytest.fail(NOT_BUILT)
        pytest.skip(NOT_BUILT)


def plain(columns: dict | None):
    """The decoder's output with its buffers as bytes, to compare."""
    if columns is None:
        return None
    out = {}
    for key, value in columns.items():
        if isinstance(value, tuple):
            out[key] = (bytes(memoryview(value[0])), value[1])
        elif type(value).__name__ == "Buffer":
            out[key] = bytes(memoryview(value))
        else:
            out[key] = value
    return out


def in_pieces(text: bytes, cuts: list[int]):
    """Feed ``text`` cut at ``cuts``, carrying each unread tail into the next piece."""
    decoder = decode._kineto.Decoder()
    tail, start = b"", 0
    for end in [*sorted(cuts), len(text)]:
        piece = tail + text[start:end]
        start = max(start, end)
        used = decoder.feed(piece)
        if used < 0:
            return None
        assert 0 <= used <= len(piece)
        tail = piece[used:]
    if decoder.feed(tail, last=True) < 0:
        return None
    return decoder.finish()


def test_kineto_trace_byte_by_byte():
    text = json.dumps(kineto_trace(), indent=2, ensure_ascii=False).encode()
    whole = plain(decode._kineto.decode(text))
    assert whole is not None and whole["n"] == 12
    assert plain(in_pieces(text, list(range(len(text))))) == whole


def test_columns_are_buffers_of_n_rows():
    text = json.dumps(kineto_trace()).encode()
    out = decode._kineto.decode(text)
    assert len(memoryview(out["ts"])) == 12 * 8  # int64, shrunk to the rows read
    codes, tokens = out["name"]
    assert len(memoryview(codes)) == 12 * 4 and b'"aten::mm"' in tokens


@pytest.mark.parametrize("what", sorted(DECLINED))
def test_odd_events_read_alike_at_every_cut(what):
    text = json.dumps({"traceEvents": [{"ph": "X", "name": "ok", "ts": 0, "dur": 1}, DECLINED[what]]}).encode()
    whole = plain(decode._kineto.decode(text))  # (None, or columns _from_native declines)
    for cut in range(len(text) + 1):
        assert plain(in_pieces(text, [cut])) == whole, cut


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]} x',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1,}]}',
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}], "traceEvents": []}',
        b'{"schemaVersion": 12, "traceEvents": [{"ph": "X", "name": "a", "ts": 12}, {"ph": "X", "ts": 3}]}',
        b'{"traceEvents": [{"ph": "X", "name": "\\u00e9\xc3\xa9", "ts": 1.5}], "baseTimeNanoseconds": 17}',
        b'{"traceEvents": [{"ph": "X", "ts": null, "cat": null, "pid": null, "args": {"Input Dims": null,'
        b' "Seq": null}}, {"ph": "X", "ts": 1, "name": "a"}]}',  # (a piece ending inside null leaves no column)
        b"{}",
        b"",
    ],
)
def test_whole_and_broken_documents_at_every_pair_of_cuts(text):
    whole = plain(decode._kineto.decode(text))
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1, 7):
            assert plain(in_pieces(text, [a, b])) == whole, (a, b)


@settings(
    max_examples=int(os.environ.get("SPTRACE_NATIVE_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(events(), min_size=1, max_size=20), st.booleans(), st.sampled_from([None, 2]), st.data())
def test_any_events_at_any_cuts_read_as_the_whole(evs, with_metadata, indent, data):
    doc = {"traceEvents": evs}
    if with_metadata:
        doc = {"schemaVersion": 1, **doc, "distributedInfo": {"rank": 0, "world_size": 2}, "other": [1, {"a": None}]}
    text = json.dumps(doc, indent=indent, ensure_ascii=indent == 2).encode()
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert plain(in_pieces(text, cuts)) == plain(decode._kineto.decode(text))


def tiny_pieces(monkeypatch):
    """Pieces of a few bytes (the buffer grows to hold an event), and no whole read of the text on
    the native path."""
    monkeypatch.setattr(decode, "native_columns", partial(decode.native_columns, piece_bytes=5))

    def whole_read(path):
        raise AssertionError(f"the native path read {path} whole")

    monkeypatch.setattr(decode, "read_bytes", whole_read)


@pytest.mark.parametrize("gz", [False, True])
def test_a_cold_load_reads_the_file_in_pieces(tmp_path, monkeypatch, gz):
    text = json.dumps(kineto_trace(), indent=1).encode()
    path = tmp_path / ("rank1.json.gz" if gz else "rank1.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    expected = decode.decode_trace(path)
    tiny_pieces(monkeypatch)
    got = decode.decode_trace(path)
    assert got[0] == expected[0] and got[0]["distributedInfo"]["rank"] == 1
    assert got[1].equals(expected[1]) and got[1].num_rows == 12


def text_pieces(path: Path, piece_bytes: int) -> list[bytes]:
    """The file's text as TraceText.read_into gives it, a copy of each piece."""
    got, buffer = [], bytearray(piece_bytes)
    with pieces.TraceText(path) as text, memoryview(buffer) as view:
        while n := text.read_into(view):
            got.append(bytes(view[:n]))
    return got


def test_pieces_join_to_the_text(tmp_path):
    text = json.dumps(kineto_trace()).encode() * 3
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text))
    got = list(text_pieces(path, piece_bytes=100))
    assert b"".join(got) == text
    assert len(got) > 10 and max(len(p) for p in got) <= 100
    plain_path = tmp_path / "t.json"
    plain_path.write_bytes(text)
    assert b"".join(text_pieces(plain_path, piece_bytes=64)) == text


def problem(path: Path) -> str:
    with pytest.raises(TraceError) as err:
        b"".join(text_pieces(path, piece_bytes=32))
    return str(err.value)


def test_broken_files_are_one_error_naming_the_file(tmp_path):
    packed = gzip.compress(json.dumps(kineto_trace()).encode())
    (tmp_path / "cut.json.gz").write_bytes(packed[: len(packed) // 2])
    (tmp_path / "bad.json.gz").write_bytes(packed[:20] + bytes(64) + packed[84:])
    (tmp_path / "empty.json").write_bytes(b"")
    assert "truncated gzip stream" in problem(tmp_path / "cut.json.gz")
    assert "corrupt gzip data" in problem(tmp_path / "bad.json.gz")
    assert "empty file" in problem(tmp_path / "empty.json")
    assert "cannot read" in problem(tmp_path / "absent.json")
    assert str(tmp_path / "cut.json.gz") in problem(tmp_path / "cut.json.gz")


def test_a_gzip_of_two_members_is_read_whole_on_every_path(tmp_path, monkeypatch):
    """gzip allows members one after another (``cat a.gz b.gz``): the text is all of them."""
    text = json.dumps(kineto_trace()).encode()
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]))
    assert decode.read_bytes(path) == text
    native = decode.decode_trace(path)
    monkeypatch.setenv("SPTRACE_DECODER", "msgspec")
    assert native[1].equals(decode.decode_trace(path)[1]) and native[1].num_rows == 12
