"""Turn user-supplied keys into typed Arrow columns with a Java/Spark type.

Hashes depend on the key's type, not just its value (Java ``Integer`` -7 and ``Long`` -7
hash differently), so every key is first given one of a few JVM types here, once, and
the hash functions dispatch on that type.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from keyflow.errors import KeyflowError


class JvmType(Enum):
    """The JVM type a key column hashes as."""

    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    STRING = "string"


@dataclass(frozen=True)
class KeyColumn:
    """One key column: non-null values plus the JVM type they hash as."""

    jvm_type: JvmType
    values: pa.Array


_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

_ARROW_TO_JVM: dict[pa.DataType, tuple[JvmType, pa.DataType]] = {
    pa.int8(): (JvmType.INT, pa.int32()),
    pa.int16(): (JvmType.INT, pa.int32()),
    pa.int32(): (JvmType.INT, pa.int32()),
    pa.uint8(): (JvmType.INT, pa.int32()),
    pa.uint16(): (JvmType.INT, pa.int32()),
    pa.int64(): (JvmType.LONG, pa.int64()),
    pa.float32(): (JvmType.FLOAT, pa.float32()),
    pa.float64(): (JvmType.DOUBLE, pa.float64()),
    pa.bool_(): (JvmType.BOOLEAN, pa.bool_()),
    pa.string(): (JvmType.STRING, pa.string()),
    pa.large_string(): (JvmType.STRING, pa.string()),
}

SUPPORTED_TYPES = "str, int, float, bool (arrays: int8/16/32/64, uint8/16, float32/64, bool, string)"


def key_column(values: Any) -> KeyColumn:
    """Type one array of keys (NumPy, Arrow, pandas or a Python sequence)."""
    array = _to_arrow(values)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if array.null_count:
        first = pc.index(pc.is_null(array), True).as_py()
        raise KeyflowError(
            f"{array.null_count} of {len(array)} keys are null (first at index {first}); "
            "keys must not be null: filter the nulls out or fill them before keying"
        )
    mapping = _ARROW_TO_JVM.get(array.type)
    if mapping is None:
        raise KeyflowError(
            f"unsupported key type {array.type}; supported: {SUPPORTED_TYPES} "
            "(cast the key, e.g. unsigned 32/64-bit integers to int64)"
        )
    jvm_type, arrow_type = mapping
    return KeyColumn(jvm_type, array.cast(arrow_type))


def scalar_key_columns(key: Any) -> list[KeyColumn]:
    """Type one key; a tuple is a composite key with one column per element."""
    parts = key if isinstance(key, tuple) else (key,)
    if not parts:
        raise KeyflowError("a composite key needs at least one element, got ()")
    return [key_column(pa.array([_scalar_to_arrow(part)])) for part in parts]


def table_key_columns(values: Any) -> list[KeyColumn]:
    """Type keys given as one array, or as a table (one column per composite-key part)."""
    if isinstance(values, (pa.Table, pa.RecordBatch)):
        columns = [key_column(column) for column in values.columns]
    elif _is_pandas_frame(values):
        columns = [key_column(values[name]) for name in values.columns]
    else:
        return [key_column(values)]
    if not columns:
        raise KeyflowError("a composite key table has no columns; pass at least one key column")
    return columns


def _scalar_to_arrow(key: Any) -> pa.Scalar:
    if key is None:
        raise KeyflowError("key is None; keys must not be null")
    if isinstance(key, (bool, np.bool_)):
        return pa.scalar(bool(key), pa.bool_())
    if isinstance(key, np.integer):
        return pa.scalar(key.item(), pa.from_numpy_dtype(key.dtype))
    if isinstance(key, int):
        if not _LONG_MIN <= key <= _LONG_MAX:
            raise KeyflowError(
                f"int key {key} is outside the 64-bit range [{_LONG_MIN}, {_LONG_MAX}]; "
                "use a str key for larger numbers"
            )
        return pa.scalar(key, pa.int64())
    if isinstance(key, (float, np.floating)):
        dtype = pa.float32() if isinstance(key, np.float32) else pa.float64()
        return pa.scalar(float(key), dtype)
    if isinstance(key, str):
        return pa.scalar(key, pa.string())
    raise KeyflowError(f"unsupported key type {type(key).__name__} ({key!r}); supported: {SUPPORTED_TYPES}")


def _to_arrow(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.ndim != 1:
            raise KeyflowError(
                f"keys must be a 1-dimensional array, got shape {values.shape}; flatten it or pass columns"
            )
        return pa.array(values.astype(values.dtype.newbyteorder("="), copy=False))
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise KeyflowError(f"keys must be an array or a sequence of keys, got {type(values).__name__}")
    if len(values) == 0:
        return pa.array([], pa.int64())
    try:
        array = pa.array(values, from_pandas=True)
    except OverflowError:
        raise KeyflowError(
            f"an int key is outside the 64-bit range [{_LONG_MIN}, {_LONG_MAX}]; use str keys for larger numbers"
        ) from None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise KeyflowError(f"keys in one array must share one supported type ({SUPPORTED_TYPES}): {error}") from None
    if pa.types.is_floating(array.type) and _holds_python_ints(values):
        raise KeyflowError(
            "keys in one array must share one type, got both int and float; an int key hashes as a Long "
            "and a float key as a Double, so cast all keys to one type first"
        )
    return array


def _holds_python_ints(values: Any) -> bool:
    """Whether a Python sequence (or object array) mixes ints in; Arrow would widen them to double.

    Looks at Python objects that Arrow has already had to visit one by one.
    """
    if hasattr(values, "dtype") and values.dtype != object:
        return False
    return any(isinstance(value, (int, np.integer)) and not isinstance(value, bool) for value in values)


def _is_pandas_frame(values: Any) -> bool:
    return type(values).__name__ == "DataFrame" and hasattr(values, "columns")
