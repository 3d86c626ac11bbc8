"""The msgspec path reads a document in pieces exactly as it reads it whole (sptrace.load.event_chunks):
whatever the piece size, and wherever a ``},{`` lies (between events, inside strings, inside lists
of objects in args, in metadata before or after the events), the metadata, the table and every
error message are those of the whole text's reading. And a cold load goes through the pieces: the
trace's text is never read whole on the msgspec path.

Oracle: ``decode._decode_whole``, the msgspec path as it was before it read in pieces, itself held
to json's reading (test_arrow.py, test_fuzz.py) and to the native decoder (test_native.py)."""

from __future__ import annotations

import gzip
import json
import os
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sptrace.load import decode, event_chunks, pieces
from sptrace.vocab.errors import TraceError
from tests.load.test_native import events, kineto_trace


def whole(path: Path):
    """(metadata, table) or the error's text, the whole text read at once."""
    try:
        return decode._decode_whole(path)
    except TraceError as exc:
        return str(exc)


def streamed(path: Path, piece_bytes: int, monkeypatch: pytest.MonkeyPatch):
    """(metadata, table) or the error's text, through decode_trace's msgspec path in pieces."""
    with monkeypatch.context() as patch:
        patch.setenv("SPTRACE_DECODER", "msgspec")
        patch.setattr(decode, "_decode_streamed", partial(decode._decode_streamed, piece_bytes=piece_bytes))
        try:
            return decode.decode_trace(path)
        except TraceError as exc:
            return str(exc)


def assert_same(expected, got) -> None:
    if isinstance(expected, str) or isinstance(got, str):
        assert got == expected
        return
    assert got[0] == expected[0]
    assert got[1].schema == expected[1].schema
    for name in expected[1].column_names:  # column by column, for a readable failure
        assert got[1][name].equals(expected[1][name]), name


def no_whole_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def whole_read(*_):
        raise AssertionError("the msgspec path read the text whole")

    monkeypatch.setattr(decode, "read_bytes", whole_read)
    monkeypatch.setattr(pieces.TraceText, "read_all", whole_read)


TRICKY = [  # a "},{" (and brackets) where no event ends
    {"ph": "X", "cat": "cpu_op", "name": 'a}, {"ph": "X"}, {', "ts": 1, "dur": 2, "pid": 1, "tid": 1,
     "args": {"Collective name": ""}},
    {"ph": "X", "name": "b", "ts": 2, "dur": 1, "args": {"Input Dims": [{"a": 1}, {"b": [{"c": 2}, {}]}],
                                                        "Concrete Inputs": ["}, {", "]"], "Seq": 3,
                                                        "Collective name": "allreduce"}},
    {"ph": "X", "name": "c\\\"}, {\\\"", "ts": 3, "dur": 1, "args": {"unknown": [{}, {}, {"x": "}, {"}]}},
    {"ph": "M", "name": "thread_name", "ts": 0, "pid": 1, "tid": 1, "args": {"name": "t}, {t", "l": [{}, {}]}},
    {"name": "f", "args": {"grid": [{"a": 1}, {"ph": "X"}]}, "ph": "X", "ts": 4, "dur": 1},
    {"ph": "s", "id": 1, "ts": 5, "bp": "", "name": "ac2g", "cat": "ac2g"},
    {"ph": "f", "id": 1, "ts": 6, "bp": "e", "name": "ac2g", "cat": "ac2g"},
]  # fmt: skip


def tricky_trace(copies: int = 4) -> dict:
    """Metadata with "},{" before and after the events, and events holding it inside them."""
    return {
        "deviceProperties": [{"id": 0, "name": "}, {"}, {"id": 1}],
        "schemaVersion": 1,
        "traceEvents": TRICKY * copies,
        "distributedInfo": {"rank": 3, "ranks": [{"a": 1}, {"b": 2}]},
        "traceName": "x}, {y",
    }


def write(tmp_path: Path, doc: dict | str | bytes, name: str = "t.json", indent: int | None = None) -> Path:
    path = tmp_path / name
    text = doc if isinstance(doc, (str, bytes)) else json.dumps(doc, indent=indent)
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


def test_a_kineto_trace_streams_alike_at_every_piece_size(tmp_path, monkeypatch):
    path = write(tmp_path, kineto_trace(), indent=1)
    expected = whole(path)
    assert not isinstance(expected, str) and expected[1].num_rows == 12
    no_whole_read(monkeypatch)
    size = path.stat().st_size
    for piece_bytes in [*range(1, 200), *range(200, size + 64, 29)]:
        assert_same(expected, streamed(path, piece_bytes, monkeypatch))


@pytest.mark.parametrize("indent", [None, 0, 2])
def test_braces_inside_strings_args_and_metadata_read_alike(tmp_path, monkeypatch, indent):
    path = write(tmp_path, tricky_trace(), indent=indent)
    expected = whole(path)
    assert not isinstance(expected, str) and expected[1].num_rows == 4 * len(TRICKY)
    assert expected[0]["distributedInfo"]["rank"] == 3 and expected[0]["traceName"] == "x}, {y"
    size = path.stat().st_size
    for piece_bytes in [*range(1, 120, 3), *range(120, size + 64, 41)]:
        assert_same(expected, streamed(path, piece_bytes, monkeypatch))


def test_a_wrong_cut_is_undone_without_reading_the_text_whole(tmp_path, monkeypatch):
    """The first piece ends just after a "},{" inside a name: that cut fails, the one before it
    (between two events) is taken, and the document is still read in pieces."""
    doc = {"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b}, {c", "ts": 2}] * 3}
    text = json.dumps(doc).encode()
    path = write(tmp_path, text)
    chunks = event_chunks.EventChunks(path, decode._TYPED_EVENTS, decode._TYPED_TOP, text.index(b"}, {c") + 5)
    got = [len(events) for events in chunks]
    assert chunks.wrong_cuts >= 1 and got and sum(got) + len(chunks.tail.traceEvents) == 6
    expected = whole(path)
    no_whole_read(monkeypatch)
    assert_same(expected, streamed(path, text.index(b"}, {c") + 5, monkeypatch))


def test_chunks_stay_near_the_piece_size(tmp_path, monkeypatch):
    """The text msgspec decodes at a time is about a piece, never the whole text."""
    path = write(tmp_path, kineto_trace() | {"traceEvents": kineto_trace()["traceEvents"] * 50}, "t.json.gz")
    expected = whole(path)
    decoded: list[int] = []

    class Recording:
        def __init__(self, decoder):
            self.decoder = decoder

        def decode(self, text):
            decoded.append(len(text))
            return self.decoder.decode(text)

    monkeypatch.setattr(decode, "_TYPED_EVENTS", Recording(decode._TYPED_EVENTS))
    monkeypatch.setattr(decode, "_TYPED_TOP", Recording(decode._TYPED_TOP))
    no_whole_read(monkeypatch)
    assert_same(expected, streamed(path, 4096, monkeypatch))
    assert len(decoded) > 20 and max(decoded) <= 2 * 4096


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]} x',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b", "ts": 2}]',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1,}, {"ph": "X", "name": "b", "ts": 2}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}], "traceEvents": []}',
        '{"traceEvents": null, "traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}',
        '{"a": {"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}}',
        '[{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}]',
        '{"schemaVersion": 1 "traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b", "ts": tru}, {"ph": "X"}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": "1"}, {"ph": "X", "name": "b", "ts": 2}]}',
        '{"traceEvents": [{"ph": "B", "name": "a", "ts": 1}, {"ph": "X", "name": "b", "ts": 2}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b", "ts": 9007199254740994.5}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b", "ts": 1e300}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "b"}, {"ph": "i", "name": "c"}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}], "distributedInfo": {"rank": 1e999}}',
        '{"distributedInfo": {"rank": 1e999}, "traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}',
        '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "args": {"Input Dims": "\\ud800"}}]}',
        '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", "ts": 1}], "schemaVersion": 2}',
        '{"traceEvents": []}',
        '{"traceEvents": [], "schemaVersion": 1}',
        '{"traceEvents": {}}',
        '{"other": 1}',
        "{}",
        "[]",
        "",
    ],
)
def test_odd_and_broken_documents_say_what_they_always_said(tmp_path, monkeypatch, text):
    path = write(tmp_path, text)
    expected = whole(path)
    for piece_bytes in [1, 2, 7, 30, 64, 4096]:
        assert_same(expected, streamed(path, piece_bytes, monkeypatch))


def test_invalid_utf8_says_what_it_always_said(tmp_path, monkeypatch):
    for text in [
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "a\xff", "ts": 1}]}',
        b'{"traceEvents": [{"ph": "X", "ts": 1, "args": {"Input Dims": "\xff"}}, {"ph": "X", "ts": 2}]}',
        b'{"traceEvents": [{"ph": "X", "ts": 1}], "traceName": "\xff"}',
    ]:
        path = write(tmp_path, text)
        for piece_bytes in [3, 40, 4096]:
            assert_same(whole(path), streamed(path, piece_bytes, monkeypatch))


def test_a_truncated_document_says_what_it_always_said(tmp_path, monkeypatch):
    text = json.dumps(tricky_trace(copies=1), separators=(",", ":")).encode()
    for cut in range(0, len(text), 5):
        path = write(tmp_path, text[:cut])
        expected = whole(path)
        assert isinstance(expected, str)
        for piece_bytes in [16, 4096]:
            assert streamed(path, piece_bytes, monkeypatch) == expected, cut


def test_broken_gzip_says_what_it_always_said(tmp_path, monkeypatch):
    packed = gzip.compress(json.dumps(kineto_trace()).encode())
    for name, data in [
        ("cut.json.gz", packed[: len(packed) // 2]),
        ("bad.json.gz", packed[:20] + bytes(64) + packed[84:]),
    ]:
        path = write(tmp_path, data, name)
        for piece_bytes in [64, 4096]:
            got = streamed(path, piece_bytes, monkeypatch)
            assert isinstance(got, str) and got == whole(path) and "gzip" in got


@settings(
    max_examples=int(os.environ.get("SPTRACE_NATIVE_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.one_of(events(), st.sampled_from(TRICKY)), max_size=25),
    st.booleans(),
    st.sampled_from([None, 2, 0]),
    st.integers(1, 600),
)
def test_any_events_at_any_piece_size_read_as_the_whole(tmp_path, monkeypatch, evs, with_metadata, indent, piece_bytes):
    doc = {"traceEvents": evs}
    if with_metadata:
        doc = {"schemaVersion": 1, "deviceProperties": [{"a": 1}, {"b": "}, {"}], **doc,
               "distributedInfo": {"rank": 0, "world_size": 2}, "other": [1, {"a": None}, {}]}  # fmt: skip
    path = write(tmp_path, json.dumps(doc, indent=indent, ensure_ascii=indent == 2))
    expected = whole(path)
    assert_same(expected, streamed(path, piece_bytes, monkeypatch))
    if not isinstance(expected, str) and decode._kineto is not None:  # and the native decoder, where it reads it
        native = decode.decode_native(path, decode.read_bytes(path))
        if native is not None:
            assert_same(expected, native)
