"""numpy / Python values <-> Arrow arrays through their buffers.

Hand-written because pyarrow's own converters (``pa.array``, ``pa.scalar``, ``Array.to_numpy``)
first ask whether a value is a pandas object, which imports pandas: 0.35 s of CPU, a fifth of
what ``sptrace info`` spends on a 50 MB trace in a fresh process (benchmarks/bench_load.py).
Building from buffers is also what those converters do once they know the type, so nothing is
lost: the decoder builds every column of the table this way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

try:  # the kernels alone: importing pyarrow.compute wraps ~290 functions in Python, 0.1 s of CPU
    from pyarrow._compute import CastOptions, DictionaryEncodeOptions, SetLookupOptions, call_function
except ImportError:  # pragma: no cover - a pyarrow that moved its private module
    from pyarrow.compute import CastOptions, DictionaryEncodeOptions, SetLookupOptions, call_function

_OFFSET_MAX = 2**31 - 1  # pa.string() offsets are int32


def from_numpy(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A 1-d numeric numpy array (and a validity mask, True = present) as an Arrow array."""
    values = np.ascontiguousarray(values)
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [bitmap, pa.py_buffer(values)])


def to_numpy(arr: pa.Array | pa.ChunkedArray, fill: int | float = 0) -> np.ndarray:
    """A primitive (int, float, bool) Arrow array's values as numpy, nulls replaced by ``fill``
    (booleans: nulls are False). Without nulls the result is a read-only view of the buffer."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if pa.types.is_boolean(arr.type):
        out = _bits(arr.buffers()[1], arr.offset, n)
        if arr.null_count:
            out &= _bits(arr.buffers()[0], arr.offset, n)
        return out
    dtype = np.dtype(arr.type.to_pandas_dtype())  # (numeric types: a numpy dtype, no pandas import)
    data = arr.buffers()[1]
    if data is None or arr.null_count == n:
        return np.full(n, fill, dtype=dtype)
    out = np.frombuffer(data, dtype=dtype, count=n, offset=arr.offset * dtype.itemsize) if n else np.empty(0, dtype)
    if arr.null_count:
        out = np.where(_bits(arr.buffers()[0], arr.offset, n), out, fill)
    return out


def present(arr: pa.Array) -> np.ndarray:
    """True where ``arr`` (one chunk) holds a value, False where it is null."""
    return _bits(arr.buffers()[0], arr.offset, len(arr)) if arr.null_count else np.ones(len(arr), dtype=bool)


def _bits(buffer: pa.Buffer | None, offset: int, n: int) -> np.ndarray:
    if buffer is None:
        return np.ones(n, dtype=bool)
    raw = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(raw, count=offset + n, bitorder="little")[offset:].astype(bool)


def string_array(texts: Sequence[str]) -> pa.Array:
    """Python strings (no None) as a pa.string() array."""
    encoded = [t.encode("utf-8", "replace") for t in texts]  # "replace": a lone surrogate from a \\ud800 escape
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if offsets[-1] > _OFFSET_MAX:
        return pa.array(texts, pa.large_string()).cast(pa.string())  # raises Arrow's own overflow error
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
    )


def dictionary(values: Sequence[str | None]) -> pa.DictionaryArray:
    """Strings or None as a dictionary array (int32 indices); each distinct string is encoded
    once, in order of first appearance."""
    distinct = dict.fromkeys(values)
    has_null = None in distinct
    if has_null:
        del distinct[None]
    code = {text: i for i, text in enumerate(distinct)}
    if has_null:
        code[None] = -1
    indices = np.fromiter(map(code.__getitem__, values), dtype=np.int32, count=len(values))
    return pa.DictionaryArray.from_arrays(
        from_numpy(indices, indices >= 0 if has_null else None), string_array(list(distinct))
    )


def compute(function: str, *args: pa.Array | pa.Scalar) -> pa.Array:
    """An Arrow compute kernel by name (``is_valid``, ``coalesce``, ``take``, ``dictionary_encode``).

    Array methods such as ``cast`` and ``take`` import pyarrow.compute on first use; the decoder
    and ``sptrace info`` call the kernels here instead (tests/cli/test_lazy_imports.py checks that)."""
    return call_function(function, list(args))


def dictionary_encode_nulls(arr: pa.Array) -> pa.DictionaryArray:
    """``arr`` dictionary-encoded with null as a value of its own (indices without nulls)."""
    return call_function("dictionary_encode", [arr], DictionaryEncodeOptions("encode"))


def cast(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """``arr.cast(target)`` (safe) without importing pyarrow.compute."""
    return arr if arr.type == target else call_function("cast", [arr], CastOptions.safe(target))


def scalar(text: str) -> pa.Scalar:
    """A string scalar (for compute kernels' comparisons)."""
    return string_array([text])[0]


def rows_where(arr: pa.Array | pa.ChunkedArray, test: Callable[[str], bool]) -> np.ndarray:
    """Rows of a string or dictionary column whose value passes ``test`` (nulls do not), as a
    numpy bool mask; ``test`` runs once per distinct value."""
    arr = _dictionary_of(arr)
    hits = np.array([value is not None and bool(test(value)) for value in arr.dictionary.to_pylist()], dtype=bool)
    return _rows_of_values(arr, hits)


def codes_of(arr: pa.Array | pa.ChunkedArray, texts: Iterable[str]) -> np.ndarray:
    """Rows of a string or dictionary column equal to one of ``texts``, as a numpy bool mask.
    The distinct values are matched by Arrow's ``is_in`` (a trace's ~1000 names in 0.02 ms,
    4x less than reading them into Python)."""
    arr = _dictionary_of(arr)
    wanted = string_array(list(dict.fromkeys(texts)))
    if arr.dictionary.type != pa.string():
        wanted = cast(wanted, arr.dictionary.type)
    return _rows_of_values(arr, to_numpy(call_function("is_in", [arr.dictionary], SetLookupOptions(wanted))))


def _rows_of_values(arr: pa.DictionaryArray, hits: np.ndarray) -> np.ndarray:
    """The rows of ``arr`` whose dictionary value ``hits`` marks (nulls: none)."""
    if not hits.any():
        return np.zeros(len(arr), dtype=bool)
    return np.append(hits, False)[to_numpy(arr.indices, fill=-1)]  # -1 (null) -> the appended False


def value_counts(arr: pa.Array | pa.ChunkedArray) -> dict[str, int]:
    """Each distinct non-null string of a column and how many rows hold it."""
    arr = _dictionary_of(arr)
    indices = to_numpy(arr.indices, fill=-1)
    counts = np.bincount(indices[indices >= 0], minlength=len(arr.dictionary)).tolist()
    out: dict[str, int] = {}
    for value, count in zip(arr.dictionary.to_pylist(), counts):
        if count:
            out[value] = out.get(value, 0) + count
    return out


def _dictionary_of(arr: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.unify_dictionaries().combine_chunks() if pa.types.is_dictionary(arr.type) else arr.combine_chunks()
    return arr if pa.types.is_dictionary(arr.type) else compute("dictionary_encode", arr)
