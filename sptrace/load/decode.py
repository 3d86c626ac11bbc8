"""Kineto JSON -> the per-rank Arrow table (sptrace.load.schema).

Three paths, one table. First the native decoder (sptrace/load/_kineto.c, when it was built):
columns straight from the JSON, no Python object per event; it declines whatever it could not
read exactly as the msgspec path does (``decode_native``, ``_from_native``).

Then msgspec decodes the events straight into typed Structs; no dict per event is ever
built, which is most of the time and memory a json/orjson parse spends (measured in
benchmarks/bench_load.py). Only the args sptrace analyses are declared; the rest is skipped by
the decoder. It too reads the text in pieces, a chunk of events at a time
(sptrace.load.event_chunks), each chunk's Structs turned into columns and dropped before the
next piece is read; a document it cannot cut (a broken one, as a rule) is read whole, as it
always was, which says what is wrong. A trace whose fields have unexpected types (a foreign
writer, a string where Kineto writes an int) fails typed validation and takes the tolerant path:
untyped msgspec decode and the same column extraction, field by field.

Hand-written because no library turns Kineto's event list into typed columns: HTA's parser
builds Python dicts, rounds nanoseconds and drops events without ``dur``.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from sptrace.load.arrow import (
    cast,
    codes_of,
    compute,
    dictionary,
    dictionary_encode_nulls,
    from_numpy,
    string_array,
    to_numpy,
)
from sptrace.load.event_chunks import EventChunks, Unstreamable
from sptrace.load.native import _kineto, native_columns, native_decoder
from sptrace.load.pieces import PIECE_BYTES, TraceText
from sptrace.load.schema import ARG_COLUMNS, SCHEMA, normalise_category
from sptrace.vocab.errors import TraceError
from sptrace.vocab.jsontypes import JSONObject

_EXACT_FLOAT_US = float(2**43)  # below this a float µs with 3 decimals maps to a unique ns
_EXACT_INT_US = float(2**53)  # below this every int µs is exactly a double


_ABSENT = -(2**63)
"""Default of the typed int args: lets numpy read a column in C (np.fromiter), no None."""


def _field(name: str) -> Any:
    return msgspec.field(default=_ABSENT, name=name)


def _raw(name: str) -> Any:
    return msgspec.field(default=msgspec.Raw(), name=name)


class _XArgs(msgspec.Struct, gc=False, omit_defaults=True):
    """args of complete ("X") events: ops, kernels, runtime calls, annotations, python frames."""

    external_id: int | None = _field("External id")
    external_id_old: int | None = _field("external id")
    correlation: int | None = _field("correlation")
    seq_num: int | None = _field("Sequence number")
    fwd_thread_id: int | None = _field("Fwd thread id")
    input_dims: msgspec.Raw = _raw("Input Dims")
    input_types: msgspec.Raw = _raw("Input type")
    concrete_inputs: msgspec.Raw = _raw("Concrete Inputs")
    coll_name: str | None = msgspec.field(default=None, name="Collective name")
    coll_dtype: str | None = msgspec.field(default=None, name="dtype")
    in_nelems: int | None = _field("In msg nelems")
    out_nelems: int | None = _field("Out msg nelems")
    group_size: int | None = _field("Group size")
    in_split: msgspec.Raw = _raw("In split size")
    out_split: msgspec.Raw = _raw("Out split size")
    pg_name: msgspec.Raw = _raw("Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = _raw("Process Group Ranks")
    comm_rank: int | None = _field("Rank")
    comm_seq: int | None = _field("Seq")
    python_id: int | None = _field("Python id")
    python_parent_id: int | None = _field("Python parent id")
    stream: int | None = _field("stream")
    device: int | None = _field("device")
    ev_idx: int | None = _field("Ev Idx")


class _IArgs(msgspec.Struct, gc=False, omit_defaults=True):
    """args of instant ("i") events: the [memory] allocator events."""

    mem_addr: int | None = _field("Addr")
    mem_bytes: int | None = _field("Bytes")
    mem_total_allocated: int | None = _field("Total Allocated")
    mem_total_reserved: int | None = _field("Total Reserved")
    device_type: int | None = _field("Device Type")
    device_id: int | None = _field("Device Id")
    ev_idx: int | None = _field("Ev Idx")


# One Struct per event phase (msgspec's tagged union on "ph"), so that each kind of event only
# declares, and the table builder only visits, the fields it can carry. Kineto writes X, i, s,
# f and M; any other phase fails validation and the trace takes the tolerant path.
class _X(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _XArgs = msgspec.field(default_factory=_XArgs)


class _I(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _IArgs = msgspec.field(default_factory=_IArgs)


class _S(msgspec.Struct, gc=False, tag_field="ph", tag="s"):
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    bp: str | None = None


class _F(_S, tag="f"):
    pass


class _M(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    name: str = ""
    cat: str | None = None
    ts: int | float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: JSONObject | None = None


_KINDS: tuple[type, ...] = (_X, _I, _S, _F, _M)
_PH = {_X: "X", _I: "i", _S: "s", _F: "f", _M: "M"}
_KIND_CODE = {kind: code for code, kind in enumerate(_KINDS)}
_ARGS = {_X: _XArgs, _I: _IArgs}
# Top-level keys Kineto writes. Decoding them and the events in one typed pass saves a scan of
# the whole file; keys not listed here are dropped on the fast path.
METADATA_KEYS = (
    "schemaVersion", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "trace_id",
    "traceName", "displayTimeUnit", "record_shapes", "profile_memory", "with_stack", "with_flops",
    "with_modules", "metadata", "username", "INFO", "host_name", "cuda_runtime_version",
    "cuda_driver_version", "cupti_version", "hip_runtime_version", "roctracer_version",
    "rocprofiler_version", "documentation",
)  # fmt: skip
_Event = _X | _I | _S | _F | _M
_Top = msgspec.defstruct(
    "_Top",
    [("traceEvents", list[_Event] | None, None)] + [(key, msgspec.Raw, msgspec.Raw()) for key in METADATA_KEYS],
    gc=False,
)
_TYPED_TOP = msgspec.json.Decoder(_Top)
_TYPED_EVENTS = msgspec.json.Decoder(list[_Event])
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


class _Times(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()


_TIMES = msgspec.json.Decoder(list[_Times])
_ANY = msgspec.json.Decoder()

# ---- bytes ---------------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    """The file's JSON text, whole, gunzipped when it is gzip (by magic number, not by name)."""
    with TraceText(path) as text:
        return text.read_all()


# ---- decoding ------------------------------------------------------------------------------


def decode_native(path: Path, data: bytes) -> tuple[JSONObject, pa.Table] | None:
    """The native decoder's reading of ``data``, or None where it declines."""
    if _kineto is None:
        return None
    columns = _kineto.decode(data)
    return None if columns is None else _native_table(path, columns)


def _native_table(path: Path, columns: dict[str, Any]) -> tuple[JSONObject, pa.Table] | None:
    try:
        return _from_native(path, columns)
    except (_Declined, msgspec.DecodeError, UnicodeDecodeError):  # (e.g. metadata holding 1e999)
        return None


def decode_trace(path: Path) -> tuple[JSONObject, pa.Table]:
    """(top-level metadata without traceEvents, event table) of one trace file.

    The native decoder reads what Kineto writes and declines anything else (it returns None),
    which then takes the msgspec paths: both give the same table (tests/load/test_native.py)."""
    if native_decoder() and (columns := native_columns(path)) is not None:
        if (decoded := _native_table(path, columns)) is not None:
            return decoded
    try:
        return _decode_streamed(path)
    except msgspec.ValidationError:  # unexpected types: the whole text's typed decode fails alike
        return _decode_tolerant(path, read_bytes(path))
    except Unstreamable:
        return _decode_whole(path)


STRUCT_PIECE_BYTES = PIECE_BYTES // 4
"""The text the msgspec path reads at a time: its Structs take several times the text they come
from, and stand beside the growing table; a quarter of the native decoder's piece keeps them small,
at no cost in time (benchmarks/bench_load.py, docs/performance.md)."""


def _decode_streamed(path: Path, piece_bytes: int = STRUCT_PIECE_BYTES) -> tuple[JSONObject, pa.Table]:
    """The typed decode of the text in pieces (``EventChunks``): each chunk's Structs become
    columns and are dropped before the next piece is read, so that the load peaks at about the
    table rather than at the text and all its Structs beside it (benchmarks/bench_load.py).

    Raises ``Unstreamable`` wherever ``_decode_whole`` could say something else (a broken document,
    a time to read as text, a metadata value msgspec rejects): it is the one that says it, as before."""
    chunks = EventChunks(path, _TYPED_EVENTS, _TYPED_TOP, piece_bytes)
    rows = _Rows()
    for events in chunks:
        foretold = (rows.n + len(events)) / max(chunks.share_read, 1e-6)  # the file's rows, from its share read
        rows.add(_chunk_columns(path, events), room=int(foretold * 1.1))
    rows.add(_chunk_columns(path, chunks.tail.traceEvents))
    head, tail = chunks.head, chunks.tail  # (a key written before and after the events: the last, as ever)
    try:
        metadata = {key: _ANY.decode(raw) for key in METADATA_KEYS if (raw := getattr(tail, key) or getattr(head, key))}
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # (a value msgspec rejects: 1e999)
        raise Unstreamable(str(exc)) from exc
    return metadata, rows.table(path)


def _chunk_columns(path: Path, events: list[Any]) -> dict[type, tuple[_Columns, int]]:
    """``_kind_columns`` of one chunk. What it finds wrong (a time beyond 64 bits, or to read as
    text) the whole text's reading says, in the order it always found it."""
    try:
        return _kind_columns(path, events)
    except (_NeedsExactTime, TraceError, UnicodeDecodeError) as exc:
        raise Unstreamable(str(exc)) from exc


def _decode_whole(path: Path) -> tuple[JSONObject, pa.Table]:
    """The typed decode of the whole text; the tolerant one where types are unexpected."""
    data = read_bytes(path)
    try:
        top = _TYPED_TOP.decode(data)
        if top.traceEvents is not None:
            metadata = {k: _ANY.decode(raw) for k in METADATA_KEYS if (raw := getattr(top, k))}
            events = top.traceEvents
            del top, data  # the Structs' Raw fields keep the bytes alive only as long as needed
            rows = _Rows()
            rows.add(_kind_columns(path, events))
            return metadata, rows.table(path)
    except (msgspec.ValidationError, _NeedsExactTime):
        pass  # unexpected types somewhere: the tolerant path below says what is wrong, if anything
    except msgspec.DecodeError as exc:  # (ValidationError is a DecodeError: order matters)
        raise TraceError(path, f"invalid JSON: {_json_problem(exc, len(data))}") from None
    except UnicodeDecodeError:  # msgspec checks UTF-8 only in what it decodes, not in Raw values
        raise TraceError(path, "invalid JSON: a string is not valid UTF-8") from None
    return _decode_tolerant(path, read_bytes(path))  # the fast path may have released the bytes


def _decode_tolerant(path: Path, data: bytes) -> tuple[JSONObject, pa.Table]:
    try:
        top = _TOP.decode(data)
    except msgspec.ValidationError:
        raise TraceError(path, "not a Kineto trace: the JSON is not an object with traceEvents") from None
    except msgspec.DecodeError as exc:
        raise TraceError(path, f"invalid JSON: {_json_problem(exc, len(data))}") from None
    raw_events = top.pop("traceEvents", None)
    if raw_events is None:
        raise TraceError(path, "no traceEvents: not a Kineto/Chrome trace (is it a different JSON file?)")
    try:  # the top level skipped what it did not need: what is inside may still be broken
        metadata = {key: _ANY.decode(value) for key, value in top.items()}
        try:  # the timestamps' text, for exact nanoseconds whatever their size
            times = [(_raw_text(t.ts), _raw_text(t.dur)) for t in _TIMES.decode(raw_events)]
        except msgspec.ValidationError:
            times = None
        events = _decode_any_events(path, raw_events)
    except msgspec.DecodeError as exc:  # (not a ValidationError: those are caught above)
        raise TraceError(path, f"invalid JSON: {_json_problem(exc, len(data))}") from None
    except UnicodeDecodeError:
        raise TraceError(path, "invalid JSON: a string is not valid UTF-8") from None
    return metadata, _table_from_dicts(path, events, times)


def _decode_any_events(path: Path, raw: msgspec.Raw) -> list[Any]:
    events = _ANY.decode(raw)
    if not isinstance(events, list):
        raise TraceError(path, "traceEvents is not a list")
    return events


def _json_problem(exc: msgspec.DecodeError, size: int) -> str:
    text = str(exc)
    match = re.search(r"byte (\d+)", text)
    if (match and int(match.group(1)) >= size - 1) or "truncated" in text.lower():
        return f"truncated after {size} bytes (the file is incomplete)"
    return text


class _NeedsExactTime(Exception):
    """A float timestamp too large to recover its nanoseconds from a double: re-read as text."""


# ---- columns -------------------------------------------------------------------------------


def _us_to_ns(values: Sequence[int | float | None], path: Path, what: str, exact_text: bool) -> pa.Array:
    """Microseconds (int, float with a fraction, or None) -> int64 nanoseconds, exactly.

    A float µs with three decimals below 2^43 µs is the nearest double to its decimal text, so
    floor + round(fraction * 1000) recovers the written nanoseconds. Above that, only the text
    is exact: the caller re-decodes (``_NeedsExactTime``)."""
    if exact_text:
        ns = [_text_us_to_ns(v) for v in values]
        bad = next((v for v, n in zip(values, ns) if n is not None and not _INT64_MIN <= n <= _INT64_MAX), None)
        if bad is not None:
            raise TraceError(path, f"an event's {what} ({bad} us) is beyond any time a 64-bit clock can hold")
        return pa.array(ns, type=pa.int64())
    try:
        x = np.array(values, dtype=np.float64)  # None -> NaN
    except (TypeError, ValueError, OverflowError):
        raise _NeedsExactTime(what) from None
    finite = np.isfinite(x)
    magnitude = np.abs(np.where(finite, x, 0.0))
    if magnitude.max(initial=0.0) >= _MAX_US:
        bad = x[np.argmax(magnitude)]
        raise TraceError(path, f"an event's {what} ({bad:g} us) is beyond any time a 64-bit clock can hold")
    whole = np.floor(np.where(finite, x, 0.0))
    frac = np.where(finite, x, 0.0) - whole
    if np.any(((frac != 0) & (magnitude >= _EXACT_FLOAT_US)) | (magnitude >= _EXACT_INT_US)):
        raise _NeedsExactTime(what)  # a fraction a double cannot hold, or an int it rounded
    ns = whole.astype(np.int64) * 1000 + np.round(frac * 1000).astype(np.int64)
    return from_numpy(ns, finite)


_INT64_MIN, _INT64_MAX = -(2**63) + 1, 2**63 - 1  # -2**63 is the typed decoder's "absent"
_MAX_US = 2**63 / 1000


def _int64(value: Any) -> int | None:
    """An int within int64, else None: a value no 64-bit counter can hold is not a measurement."""
    return value if type(value) is int and _INT64_MIN <= value <= _INT64_MAX else None


def _text_us_to_ns(value: Any) -> int | None:
    """'1700000000123456.789' -> 1700000000123456789, digit by digit (no float rounding)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1000
    text = (value if isinstance(value, str) else repr(value)).strip().strip('"')
    try:
        if "e" in text or "E" in text:
            ns = float(text) * 1000
            if math.isinf(ns):  # beyond a double: beyond 64 bits too, which the caller reports
                return _INT64_MAX + 1 if ns > 0 else _INT64_MIN - 1
            return round(ns)
        whole, _, frac = text.partition(".")
        sign = -1 if whole.startswith("-") else 1
        return int(whole) * 1000 + sign * int((frac + "000")[:3])
    except ValueError:
        return None


_STREAM = re.compile(r"(?:stream\s*)?(-?\d+)$")


def _to_int(value: Any) -> int | None:
    """pid / tid / flow id: ints, numeric strings, and old traces' "stream 7"."""
    if isinstance(value, int) or value is None:
        return value
    if isinstance(value, str):
        m = _STREAM.match(value.strip())
        return int(m.group(1)) if m else None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _raw_text(raw: msgspec.Raw) -> str | None:
    """A Raw JSON value as text; strings lose their quotes; absent or null -> None."""
    if not raw:
        return None
    text = bytes(raw).decode()
    if text == "null":
        return None
    if text.startswith('"'):
        return _ANY.decode(raw)
    return text


def _ints(values: Sequence[Any]) -> pa.Array:
    """int64 column from Python values: numpy's C conversion when all are ints (the common
    case), else the ints as they are and the rest value by value (None, numeric strings,
    "stream 7")."""
    n = len(values)
    try:
        return from_numpy(np.fromiter(values, dtype=np.int64, count=n))
    except (TypeError, ValueError, OverflowError):
        pass
    fixed = list(values)  # usually a handful of odd values ("Spans", "stream 7") among the ints
    is_int = np.fromiter(map(isinstance, values, itertools.repeat(int)), dtype=bool, count=n)
    for i in np.flatnonzero(~is_int).tolist():
        value = _int64(_to_int(values[i]))
        fixed[i] = _ABSENT if value is None else value
    try:
        arr = np.fromiter(fixed, dtype=np.int64, count=n)
    except OverflowError:  # an int beyond 64 bits: no counter holds it, so it is no id
        arr = np.fromiter((v if _INT64_MIN <= v <= _INT64_MAX else _ABSENT for v in fixed), dtype=np.int64, count=n)
    return from_numpy(arr, arr != _ABSENT)


def _sentinel_values(objects: Sequence[Any], attr: str, n: int) -> np.ndarray:
    """int64 values of a typed-Struct field whose absent value is ``_ABSENT`` (kept as is)."""
    try:
        return np.fromiter(map(operator.attrgetter(attr), objects), dtype=np.int64, count=n)
    except (TypeError, OverflowError):  # a JSON null, or an int beyond 64 bits: both become nulls
        values = (_int64(v) for v in map(operator.attrgetter(attr), objects))
        return np.fromiter((_ABSENT if v is None else v for v in values), dtype=np.int64, count=n)


def _take(items: list[Any], rows: np.ndarray) -> list[Any] | tuple[Any, ...]:
    """``items`` at ``rows`` (at least one), gathered in C; itemgetter of one index returns the
    item itself, hence the special case."""
    if len(rows) == 1:
        return [items[int(rows[0])]]
    return operator.itemgetter(*rows.tolist())(items)  # (Python ints: numpy scalars are slower)


def _rows_with(args: list[Any], cat: pa.DictionaryArray) -> dict[str, np.ndarray | None]:
    """Which rows may carry each args field: None for all of them; a field no row carries is
    left out.

    Reading a field off every Struct costs the same whether it is there or not, and each
    category of event carries a few of the ~25 declared fields (a kernel: ids, stream, device;
    a runtime call: ids alone). So the rows are split by category, and each category's args are
    encoded back with msgspec, which omits absent fields (``omit_defaults``): a field whose key
    is not in that text is absent from the whole category, and is not read there. A key that
    only appears inside a string value makes the field read for nothing, never missed."""
    codes = to_numpy(cat.indices, fill=-1) if len(cat) else np.zeros(0, np.int32)
    order = np.argsort(codes, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    keys = {attr: f'"{name}":'.encode() for attr, name in zip(type(args[0]).__struct_fields__, _encoded_names(args[0]))}
    found: dict[str, tuple[int, ...]] = {}
    for g, rows in enumerate(groups):
        members = _take(args, rows)
        text = _ENCODER.encode(members)
        # a category's events carry much the same fields: take those of a sample of its events,
        # and scan for every other key only when their count falls short of the text's '":'
        sample = _ENCODER.encode(members[:: max(1, len(members) // 256)])
        present = [attr for attr, key in keys.items() if key in sample]
        if sum(text.count(keys[attr]) for attr in present) != text.count(b'":'):
            present = [attr for attr, key in keys.items() if key in text]
        for attr in present:
            found[attr] = (*found.get(attr, ()), g)
    rows_of: dict[tuple[int, ...], np.ndarray | None] = {}  # one array per set of categories
    for which in set(found.values()):
        rows_of[which] = None if len(which) == len(groups) else np.sort(np.concatenate([groups[g] for g in which]))
    return {attr: rows_of[which] for attr, which in found.items()}


def _encoded_names(struct: Any) -> tuple[str, ...]:
    """The JSON keys of a Struct's fields (their ``name=``), in field order."""
    return tuple(f.encode_name for f in msgspec.structs.fields(struct))


_ENCODER = msgspec.json.Encoder()


def _texts(values: Sequence[Any], n: int) -> pa.Array:
    """A string column (dictionary-encoded) from str or Raw values; a Raw's JSON text is
    decoded once per distinct value. "" is kept: whether a kind's column of "" and nulls alone
    is null is decided over all the kind's events, in ``_Rows.table`` (``_STR_COLUMNS``)."""
    if not any(values):
        return dictionary(values) if "" in values else pa.nulls(n, type=pa.string())
    if isinstance(next(v for v in values if v), msgspec.Raw):
        raw = [bytes(v) if v else None for v in values]
        text = {b: _raw_text(msgspec.Raw(b)) for b in dict.fromkeys(raw) if b is not None}
        values = list(map(text.get, raw))
    return dictionary(values)


def _plain(arr: pa.Array) -> pa.Array:
    return cast(arr, pa.string())


def _categories(raw_cat: pa.Array, ph: pa.Array, name: pa.Array) -> pa.Array:
    """Vectorised ``normalise_category``: map the few distinct raw categories, then patch the
    rows whose category depends on the name (old traces' uncategorised [memory] instants,
    old "async"/"launch" flows) or on ph (metadata)."""
    encoded = raw_cat if pa.types.is_dictionary(raw_cat.type) else compute("dictionary_encode", raw_cat)
    mapped = [normalise_category(c, "X", "") for c in encoded.dictionary.to_pylist()]
    vocabulary = list(dict.fromkeys([*mapped, "metadata", "cpu_instant_event", "other", "ac2g"]))
    code = {c: i for i, c in enumerate(vocabulary)}
    cats = np.array([code[c] for c in mapped] + [-1], dtype=np.int32)[to_numpy(encoded.indices, fill=-1)]
    uncategorised = cats < 0
    if uncategorised.any():  # (in place, a mask at a time: this runs beside the whole table)
        metadata = codes_of(ph, ["M"])
        cats[uncategorised & metadata] = code["metadata"]
        uncategorised &= ~metadata
        del metadata
        memory = codes_of(name, ["[memory]"])
        cats[uncategorised & memory] = code["cpu_instant_event"]
        cats[uncategorised & ~memory] = code["other"]
    launch = codes_of(raw_cat, ["async"]) & codes_of(name, ["launch"])
    if launch.any():
        cats[launch] = code["ac2g"]
    return pa.DictionaryArray.from_arrays(from_numpy(cats), string_array(vocabulary))


def _thread_names(pid: pa.Array, tid: pa.Array, ph: pa.Array, name: pa.Array, meta: pa.Array) -> pa.Array:
    """Each event's thread name, from the trace's thread_name metadata events."""
    rows = np.flatnonzero(codes_of(ph, ["M"]) & codes_of(name, ["thread_name"]))
    if not len(rows):
        return pa.nulls(len(pid), pa.string())
    # each distinct pid and tid once (Arrow's hash encoding, null its own value), then each
    # distinct pair: int32 codes a row, made in place (this runs beside the whole table)
    pid_codes = dictionary_encode_nulls(pid)
    tid_codes = dictionary_encode_nulls(tid)
    first_pid = to_numpy(pid_codes.dictionary, fill=_ABSENT)  # (no event's id is _ABSENT)
    first_tid = to_numpy(tid_codes.dictionary, fill=_ABSENT)
    width = len(first_tid)
    pair = to_numpy(pid_codes.indices).astype(np.int32 if len(first_pid) * width < 2**31 else np.int64)
    del pid_codes
    pair *= width
    pair += to_numpy(tid_codes.indices)
    del tid_codes
    names = compute("take", meta, from_numpy(rows)).to_pylist()
    named = dict(zip(zip(first_pid[pair[rows] // width].tolist(), first_tid[pair[rows] % width].tolist()), names))
    pairs = compute("dictionary_encode", from_numpy(pair))  # the last name wins
    del pair
    distinct = to_numpy(pairs.dictionary)
    keys = zip(first_pid[distinct // width].tolist(), first_tid[distinct % width].tolist())
    return compute("take", dictionary([named.get(key) for key in keys]), pairs.indices)


_RAW_ARGS = {"input_dims", "input_types", "concrete_inputs", "in_split", "out_split", "pg_name", "pg_ranks"}
_STR_ARGS = {"coll_name", "coll_dtype", "pg_desc"}


def _finish(path: Path, columns: dict[str, pa.Array]) -> pa.Table:
    """Checks and derived columns shared by both paths; the table in schema order."""
    ts, ph, name = columns["ts_ns"], columns["ph"], columns["name"]
    timed = to_numpy(compute("is_valid", ts))
    missing = ~timed & ~codes_of(ph, ["M", ""])
    n_missing = int(missing.sum())
    if n_missing:
        first = int(np.argmax(missing))
        noun = "event has" if n_missing == 1 else "events have"
        raise TraceError(path, f"{n_missing} {noun} no ts (the first: {_plain(name)[first]})")
    if not timed.any():
        raise TraceError(path, "no timed events: the trace is empty")
    columns["cat"] = _categories(columns["raw_cat"], ph, name)
    columns["thread_name"] = _thread_names(columns["pid"], columns["tid"], ph, name, columns["meta"])
    arrays = []
    for field in SCHEMA:
        arr = columns[field.name]
        if pa.types.is_dictionary(field.type) and not pa.types.is_dictionary(arr.type):
            arr = compute("dictionary_encode", arr)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _group_columns(kind: type, events: list[Any]) -> dict[str, pa.Array]:
    """The columns one kind of event carries, each as long as ``events``."""
    n = len(events)

    def field(attr: str) -> list:
        return list(map(operator.attrgetter(attr), events))

    columns: dict[str, pa.Array] = {
        "name": dictionary(field("name")),
        "raw_cat": dictionary(field("cat")),
        "ts": field("ts"),
        "pid": _ints(field("pid")),
        "tid": _ints(field("tid")),
    }
    if kind is _X:
        columns["dur"] = field("dur")
    if kind in (_S, _F):
        columns["flow_id"] = _ints(field("id"))
        columns["flow_bp"] = _texts(field("bp"), n)
    if kind is _M:
        metas = [a or {} for a in field("args")]
        columns["meta"] = dictionary([_meta_text(m) for m in metas])
    if kind in _ARGS:
        args = field("args")
        rows_of = _rows_with(args, columns["raw_cat"]) if n else {}
        subsets: dict[int, Any] = {}
        for attr in _ARGS[kind].__struct_fields__:
            if attr == "external_id_old":
                continue
            columns[attr] = _arg_column(args, attr, rows_of, n, subsets)
        if kind is _X and "external_id_old" in rows_of:
            old = _arg_column(args, "external_id_old", rows_of, n, subsets)
            columns["external_id"] = compute("coalesce", columns["external_id"], old)
    return columns


def _arg_column(
    args: list[Any], attr: str, rows_of: dict[str, np.ndarray | None], n: int, subsets: dict[int, Any]
) -> pa.Array:
    """One args field as a column, read only on the rows that may carry it (``_rows_with``);
    ``subsets`` keeps each set of rows' Structs for the next field on the same rows."""
    text = attr in _RAW_ARGS | _STR_ARGS
    if attr not in rows_of:
        return pa.nulls(n, pa.string() if text else pa.int64())
    rows = rows_of[attr]
    if rows is None:
        subset = args
    elif id(rows) in subsets:
        subset = subsets[id(rows)]
    else:
        subset = _take(args, rows)
        subsets[id(rows)] = subset
    if text:
        values = list(map(operator.attrgetter(attr), subset))
        if rows is not None:
            full: list[Any] = [None] * n
            for i, v in zip(rows.tolist(), values):
                full[i] = v
            values = full
        return _texts(values, n)
    found = _sentinel_values(subset, attr, len(subset))
    if rows is not None:
        full_ints = np.full(n, _ABSENT, dtype=np.int64)
        full_ints[rows] = found
        found = full_ints
    return from_numpy(found, found != _ABSENT)


def _meta_text(args: JSONObject) -> str | None:
    value = args.get("name", args.get("labels"))
    return value if isinstance(value, str) or value is None else str(value)


_Columns = dict[str, pa.Array]


def _kind_columns(path: Path, events: list[Any]) -> dict[type, tuple[_Columns, int]]:
    """Each kind's columns (and rows) from decoded Structs, the kinds in ``_KINDS`` order, those
    absent left out. Memory: ``events`` is emptied, and each kind's Structs are dropped as soon as
    its columns exist, the largest kind (X) last, so the peak is about the Structs plus one kind's
    columns (benchmarks/bench_load.py measures it)."""
    n = len(events)
    codes = np.fromiter(map(_KIND_CODE.__getitem__, map(type, events)), dtype=np.int8, count=n)
    groups: dict[type, list[Any]] = {}
    for code, kind in enumerate(_KINDS):
        idx = np.flatnonzero(codes == code)
        if len(idx):
            groups[kind] = list(_take(events, idx))
    events.clear()  # the Structs now live only in their group
    del codes
    parts: dict[type, tuple[_Columns, int]] = dict.fromkeys(groups, ({}, 0))
    for kind in sorted(groups, key=lambda kind: kind is _X):
        group = groups.pop(kind)  # (this kind's Structs go with its last reference, below)
        cols = _group_columns(kind, group)
        cols["ts"] = _us_to_ns(cols["ts"], path, "ts", False)
        if "dur" in cols:
            cols["dur"] = _us_to_ns(cols["dur"], path, "dur", False)
        parts[kind] = (cols, len(group))
        del group
    return parts


_INT_COLUMNS = ("pid", "tid", "flow_id", "ts", "dur", *(c for c, t, _ in ARG_COLUMNS if pa.types.is_integer(t)))
_TEXT_COLUMNS = ("name", "raw_cat", "flow_bp", *(c for c, t, _ in ARG_COLUMNS if not pa.types.is_integer(t)))
_STR_COLUMNS = ("flow_bp", "coll_name", "coll_dtype", "pg_desc")
"""Text columns of str fields: a kind none of whose events fills one with more than "" has it null
(as the native decoder reads it: ``falsy_kinds``). Decided over the kind's rows of all runs, since a
run of "" alone may be followed by one with text (``_texts`` keeps "" for this)."""


class _InOrder:
    """Arrays put in the table's row order (``order``: grouped by phase; None, already so) in
    place, through one scratch array per dtype: their pages are already the process's, and a new
    array per column would fault in as many again."""

    def __init__(self, order: np.ndarray | None) -> None:
        self.order = order
        self.scratch: dict[np.dtype, np.ndarray] = {}

    def __call__(self, values: np.ndarray) -> np.ndarray:
        if self.order is not None:
            if values.dtype not in self.scratch:
                self.scratch[values.dtype] = np.empty(len(self.order), values.dtype)
            out = self.scratch[values.dtype]
            np.take(values, self.order, out=out)
            values[...] = out
        return values


def _phase_rows(counts: np.ndarray) -> dict[str, slice]:
    """Each phase's rows in a table grouped by phase, ``counts[k]`` rows of ``_PHASES[k]``."""
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return {p: slice(int(bounds[k]), int(bounds[k + 1])) for k, p in enumerate(_PHASES)}


def _phase_column(counts: np.ndarray) -> pa.DictionaryArray:
    """The ph column of a table grouped by phase, ``counts[k]`` rows of ``_PHASES[k]``."""
    present = [k for k in range(len(_PHASES)) if counts[k]]
    return pa.DictionaryArray.from_arrays(
        from_numpy(np.repeat(np.arange(len(present), dtype=np.int32), counts[present])),
        string_array([_PHASES[k] for k in present]),
    )


def _null_where_no_text(codes: np.ndarray, texts: Sequence[str | None], kinds: Iterable[slice]) -> None:
    """In place: each kind (its rows) none of whose codes points at a text other than "" is null
    (-1) throughout, as ``_texts`` reads a kind's str values."""
    truthy = np.array([bool(t) for t in texts] + [False])
    for rows in kinds:
        if not truthy[codes[rows]].any():
            codes[rows] = -1


class _Rows:
    """The table's columns grown run of events by run (``add``; file order, each run's rows grouped
    by kind), as the native decoder's buffers grow, then put in the table's order in place
    (``table``). So the runs' columns never stand beside their concatenation: a streamed load peaks
    at about the table. Integers are kept with ``_ABSENT`` for null; texts as int32 codes into the
    texts seen, a dictionary per column that ``_first_seen`` orders at the end."""

    def __init__(self) -> None:
        self.n = 0
        self.arrays: dict[str, np.ndarray] = {"ph": np.empty(0, np.int8)}
        self.arrays |= {c: np.empty(0, np.int64) for c in _INT_COLUMNS}
        self.arrays |= {c: np.empty(0, np.int32) for c in _TEXT_COLUMNS}
        self.texts: dict[str, dict[str, int]] = {c: {} for c in _TEXT_COLUMNS}

    def add(self, parts: dict[type, tuple[_Columns, int]], room: int = 0) -> None:
        """One run's columns (``_kind_columns``), dropped as they are copied. ``room``: the rows
        foreseen in all, made room for at once where there is less: each regrowth copies the
        arrays and may leave their old copy resident, while room never written to costs nothing."""
        need = self.n + sum(m for _, m in parts.values())
        if need > len(self.arrays["ph"]):
            size = max(need, room, 2 * len(self.arrays["ph"]))
            for column, values in self.arrays.items():  # (np.empty: pages not yet written cost nothing)
                self.arrays[column] = np.empty(size, values.dtype)
                self.arrays[column][: self.n] = values[: self.n]
        for kind, (cols, m) in parts.items():
            lo, hi = self.n, self.n + m
            self.arrays["ph"][lo:hi] = _KIND_CODE[kind]
            for column in _INT_COLUMNS:
                arr = cols.pop(column, None)
                self.arrays[column][lo:hi] = _ABSENT if arr is None else to_numpy(arr, fill=_ABSENT)
            for column in _TEXT_COLUMNS:
                arr = cols.pop(column, None)
                self.arrays[column][lo:hi] = -1 if arr is None else self._codes(column, arr)
            self.n = hi

    def _codes(self, column: str, arr: pa.Array) -> np.ndarray | int:
        if arr.null_count == len(arr):
            return -1
        seen = self.texts[column]
        texts = (arr if pa.types.is_dictionary(arr.type) else compute("dictionary_encode", arr)).dictionary
        lut = np.array([seen.setdefault(t, len(seen)) for t in texts.to_pylist()] + [-1], dtype=np.int32)
        return lut[to_numpy(arr.indices, fill=-1)]

    def table(self, path: Path) -> pa.Table:
        """The table: rows grouped by phase (X, i, s, f, M), in file order within each group, each
        dictionary in order of first appearance; the columns are dropped as they are wrapped."""
        n, arrays = self.n, self.arrays
        for values in arrays.values():
            values.resize(n, refcheck=False)
        ph = arrays.pop("ph")
        in_order = _InOrder(np.argsort(ph, kind="stable") if (np.diff(ph) < 0).any() else None)
        counts = np.bincount(ph, minlength=len(_KINDS))
        kinds = list(_phase_rows(counts).values())
        columns: dict[str, pa.Array] = {}
        for column in _INT_COLUMNS:
            values = in_order(arrays.pop(column))
            columns[{"ts": "ts_ns", "dur": "dur_ns"}.get(column, column)] = from_numpy(values, values != _ABSENT)
        for column in _TEXT_COLUMNS:
            codes, texts = in_order(arrays.pop(column)), list(self.texts.pop(column))
            if column in _STR_COLUMNS:
                _null_where_no_text(codes, texts, kinds)
            columns[column] = _as_type(_first_seen(codes, texts), n, SCHEMA.field(column).type)
        in_order.scratch.clear()  # (_finish runs beside the whole table)
        columns["ph"] = _phase_column(counts)
        return _finish(path, columns)


class _Declined(Exception):
    """The native decoder's output holds something only the msgspec path reads as it should."""


_PHASES = ("X", "i", "s", "f", "M")  # the native decoder's ph codes


def _from_native(path: Path, out: dict[str, Any]) -> tuple[JSONObject, pa.Table]:
    """The table from the native decoder's columns (file order), as ``_Rows``
    builds it: rows grouped by phase (X, i, s, f, M), in file order within each group, and each
    dictionary in order of first appearance."""
    n = out["n"]
    top = dict(out["top"])
    if not n or len(top) != len(out["top"]):  # (no events, or a repeated key: the other paths decide)
        raise _Declined
    metadata = {key: _ANY.decode(top[key.encode()]) for key in METADATA_KEYS if key.encode() in top}
    ph = np.frombuffer(out["ph"], dtype=np.int8)
    order = np.argsort(ph, kind="stable")
    ph = ph[order]
    counts = np.bincount(ph, minlength=len(_PHASES))
    kind_rows = _phase_rows(counts)
    reorder = _InOrder(order)

    def in_order(raw: Any, dtype: type) -> np.ndarray:
        """A decoder buffer's values grouped by phase, in the buffer itself."""
        return reorder(np.frombuffer(raw, dtype=dtype))

    def ints(key: str) -> np.ndarray:
        raw = out.pop(key, None)  # (each buffer is dropped once its column is built: the load's peak)
        return np.full(n, _ABSENT, dtype=np.int64) if raw is None else in_order(raw, np.int64)

    def int_column(key: str) -> pa.Array:
        values = ints(key)
        if key in ("pid", "tid", "id") and f"{key}_s" in out:  # strings: "Spans", "stream 7"
            codes, tokens = out.pop(f"{key}_s")
            parsed = [_int64(_to_int(_ANY.decode(t))) for t in tokens]
            lut = np.array([_ABSENT if v is None else v for v in parsed] + [_ABSENT], dtype=np.int64)
            codes = in_order(codes, np.int32)
            values = np.where(codes >= 0, lut[codes], values)
        return from_numpy(values, values != _ABSENT)

    def text_column(key: str, decode: Any, falsy_kinds: str = "") -> pa.DictionaryArray:
        """``falsy_kinds``: the phases whose values are all null when none is truthy (as
        ``_texts`` reads a kind's str values)."""
        if key not in out:
            return pa.nulls(n, pa.string())
        buffer, tokens = out.pop(key)
        codes = in_order(buffer, np.int32)
        del buffer
        values = [decode(t) for t in tokens]
        if falsy_kinds:
            _null_where_no_text(codes, values, [kind_rows[p] for p in falsy_kinds])
        return _first_seen(codes, values)

    def string(token: bytes) -> str:
        return token[1:-1].decode() if b"\\" not in token else _ANY.decode(token)

    def raw(token: bytes) -> str | None:
        """``_raw_text``'s reading of a token the native decoder has validated (UTF-8 and
        escapes), so that a string without escapes needs no msgspec pass."""
        if not token or token == b"null":
            return None
        return string(token) if token[:1] == b'"' else token.decode()

    columns: dict[str, pa.Array] = {
        "name": text_column("name", string),
        "raw_cat": text_column("cat", string),
        "pid": int_column("pid"),
        "tid": int_column("tid"),
        "flow_id": int_column("id"),
        "flow_bp": text_column("bp", string, "sf"),
        "ts_ns": int_column("ts"),
        "dur_ns": int_column("dur"),
    }
    for column, arrow_type, _ in ARG_COLUMNS:
        if column == "meta":
            continue
        if column in _RAW_ARGS:
            arr = text_column(column, raw)
        elif column in _STR_ARGS:
            arr = text_column(column, string, "X")
        else:
            arr = int_column(column)
        columns[column] = _as_type(arr, n, arrow_type)
    if "external_id_old" in out:
        columns["external_id"] = compute("coalesce", columns["external_id"], int_column("external_id_old"))
    reorder.scratch.clear()  # (_finish runs beside the whole table)
    meta_codes = np.full(n, -1, dtype=np.int32)
    meta_values: list[str | None] = []
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    for row, token in out["meta"]:
        args = _ANY.decode(token)
        if args is not None and not isinstance(args, dict):
            raise _Declined
        meta_codes[position[row]] = len(meta_values)
        meta_values.append(_meta_text(args or {}))
    columns["meta"] = _as_type(_first_seen(meta_codes, meta_values), n, pa.string())
    columns["ph"] = _phase_column(counts)
    return metadata, _finish(path, columns)


def _first_seen(codes: np.ndarray, values: Sequence[str | None]) -> pa.DictionaryArray:
    """A dictionary column from codes into ``values`` (-1: null; a None value: null), with its
    distinct values in order of first appearance, as ``dictionary`` builds it."""
    n, k = len(codes), len(values)
    first = np.full(k + 1, n, dtype=np.int64)
    valid = codes >= 0
    np.minimum.at(first, codes[valid], np.flatnonzero(valid))
    used = np.flatnonzero(first[:k] < n)
    order = used[np.argsort(first[used], kind="stable")]
    lut = np.full(k + 1, -1, dtype=np.int32)  # (the last entry: code -1)
    texts = [values[t] for t in order.tolist()]
    if None not in texts and len(set(texts)) == len(texts):  # (the usual case: each token its own text)
        lut[order] = np.arange(len(order), dtype=np.int32)
        distinct = texts
    else:
        found: dict[str, int] = {}
        for t, text in zip(order.tolist(), texts):
            if text is not None:
                lut[t] = found.setdefault(text, len(found))
        distinct = list(found)
    indices = lut[codes]
    return pa.DictionaryArray.from_arrays(from_numpy(indices, indices >= 0), string_array(distinct))


def _as_type(chunk: pa.Array | None, n: int, arrow_type: pa.DataType) -> pa.Array:
    if chunk is None:
        return pa.nulls(n, arrow_type)
    if pa.types.is_dictionary(arrow_type) and not pa.types.is_dictionary(chunk.type):
        chunk = compute("dictionary_encode", chunk)
    return cast(chunk, arrow_type)


def _table_from_dicts(path: Path, events: list[Any], times: list[tuple[Any, Any]] | None = None) -> pa.Table:
    """The tolerant path: any JSON types, converted field by field. ``times`` holds each
    event's ts and dur as written (text), for exact nanoseconds."""
    if times is not None and len(times) == len(events):
        keep = [i for i, e in enumerate(events) if isinstance(e, dict)]
        times = [times[i] for i in keep]
    else:
        times = None
    good = [e for e in events if isinstance(e, dict)]

    def as_str(v: Any) -> str | None:
        if v is None:
            return None
        return v if isinstance(v, str) else msgspec.json.encode(v).decode()

    def as_int(v: Any) -> int | None:
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return _int64(v)
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return _int64(int(v))
        if isinstance(v, str):
            try:
                return _int64(int(v, 0))
            except ValueError:
                return _int64(_to_int(v))
        return None

    def as_time(v: Any) -> Any:
        if isinstance(v, str):
            try:
                return float(v) if any(c in v for c in ".eE") else int(v)
            except ValueError:
                return None
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    columns: dict[str, pa.Array] = {
        "name": pa.array(["" if e.get("name") is None else str(e["name"]) for e in good], pa.string()),
        "raw_cat": pa.array([None if e.get("cat") is None else str(e["cat"]) for e in good], pa.string()),
        "ph": pa.array(["" if e.get("ph") is None else str(e["ph"]) for e in good], pa.string()),
        "ts_ns": _us_to_ns(
            [t[0] for t in times] if times else [as_time(e.get("ts")) for e in good], path, "ts", exact_text=True
        ),
        "dur_ns": _us_to_ns(
            [t[1] for t in times] if times else [as_time(e.get("dur")) for e in good], path, "dur", exact_text=True
        ),
        "pid": pa.array([as_int(e.get("pid")) for e in good], pa.int64()),
        "tid": pa.array([as_int(e.get("tid")) for e in good], pa.int64()),
        "flow_id": pa.array([as_int(e.get("id")) for e in good], pa.int64()),
        "flow_bp": pa.array([as_str(e.get("bp")) for e in good], pa.string()),
    }
    arg_dicts = [e.get("args") if isinstance(e.get("args"), dict) else {} for e in good]
    for column, arrow_type, keys in ARG_COLUMNS:
        integer = pa.types.is_integer(arrow_type)
        values = []
        for a in arg_dicts:
            v = None
            for key in keys:
                if a.get(key) is not None:
                    v = a[key]
                    break
            values.append(as_int(v) if integer else as_str(v))
        columns[column] = pa.array(values, type=pa.int64() if integer else pa.string())
    # rows grouped by phase as the other paths group them (X, i, s, f, M; any other phase after)
    rank = {ph: k for k, ph in enumerate(_PHASES)}
    phases = columns["ph"].to_pylist()
    order = np.argsort(np.fromiter((rank.get(ph, len(rank)) for ph in phases), np.int8, len(phases)), kind="stable")
    if (np.diff(order) < 0).any():
        rows = from_numpy(order)
        columns = {name: compute("take", arr, rows) for name, arr in columns.items()}
    return _finish(path, columns)
