"""Element types, defined once: every spelling a trace uses for a dtype -> (canonical name, bytes).

Traces name element types three ways: the c10d/aten ``Input type`` strings (C++ type names:
``float``, ``c10::BFloat16``, ``long int``), ``record_param_comms``' ``dtype`` arg (ScalarType
names: ``Float``, ``BFloat16``) and torch's own names (``float32``, ``bfloat16``). All three map
here; a name not in the table is unknown, never guessed.
"""

from __future__ import annotations

# canonical name -> (bytes, every spelling seen in traces)
_TABLE: dict[str, tuple[int, tuple[str, ...]]] = {
    "float32": (4, ("float", "c10::float", "Float", "float32", "torch.float32", "fp32")),
    "float64": (8, ("double", "Double", "float64", "torch.float64")),
    "float16": (2, ("c10::Half", "Half", "float16", "torch.float16", "half", "fp16")),
    "bfloat16": (2, ("c10::BFloat16", "BFloat16", "bfloat16", "torch.bfloat16", "bf16")),
    "int64": (8, ("long int", "long", "int64_t", "Long", "int64", "torch.int64", "long long")),
    "int32": (4, ("int", "Int", "int32", "int32_t", "torch.int32")),
    "int16": (2, ("short int", "short", "Short", "int16", "torch.int16")),
    "int8": (1, ("signed char", "Char", "int8", "torch.int8")),
    "uint8": (1, ("unsigned char", "Byte", "uint8", "torch.uint8")),
    "bool": (1, ("bool", "Bool", "torch.bool")),
    "float8_e4m3fn": (1, ("c10::Float8_e4m3fn", "Float8_e4m3fn", "float8_e4m3fn", "torch.float8_e4m3fn")),
    "float8_e5m2": (1, ("c10::Float8_e5m2", "Float8_e5m2", "float8_e5m2", "torch.float8_e5m2")),
    "complex64": (8, ("c10::complex<float>", "ComplexFloat", "complex64")),
}
_BY_SPELLING: dict[str, str] = {s: name for name, (_, spellings) in _TABLE.items() for s in spellings}

ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes ``--dtype`` accepts for activations."""


def canonical(name: object) -> str | None:
    """'c10::BFloat16' -> 'bfloat16'; None for anything not an element type (TensorList, '')."""
    if not isinstance(name, str):
        return None
    return _BY_SPELLING.get(name.strip())


def element_size(name: object) -> int | None:
    """Bytes per element of a dtype spelled any way the table knows; None when unknown."""
    canon = canonical(name)
    return None if canon is None else _TABLE[canon][0]


# c10::ScalarType codes, as factory ops (aten::empty, aten::zeros ...) record their dtype argument
_SCALAR_TYPE_CODES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
    9: "complex64", 11: "bool", 15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn",
}  # fmt: skip


def from_scalar_type_code(text: object) -> str | None:
    """'6' (a factory op's recorded dtype argument) -> 'float32'; None when not a known code."""
    if isinstance(text, str) and text.strip().isdigit():
        return _SCALAR_TYPE_CODES.get(int(text))
    return None
