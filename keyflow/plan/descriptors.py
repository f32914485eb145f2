"""State descriptors: the per-key state a ``process`` function declares up front.

Declaring state (name and Arrow type) before the pipeline runs lets keyflow validate it,
store it by key group and, in streaming, persist and restore it across rescales. They are
part of the plan: a restore matches each operator's declared state with the checkpoint's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from keyflow.errors import PlanError


def arrow_type(value: pa.DataType | str, what: str) -> pa.DataType:
    """An Arrow type from a type or an alias such as ``"float64"``, ``"string"``, ``"timestamp[us]"``."""
    if isinstance(value, pa.DataType):
        return value
    try:
        return pa.type_for_alias(str(value))
    except ValueError:
        raise PlanError(
            f"{what}: {value!r} is not an Arrow type; use a pyarrow type or an alias such as "
            "'int64', 'float64', 'string', 'bool', 'timestamp[us]'"
        ) from None


@dataclass(frozen=True)
class ValueState:
    """One value per key."""

    type: pa.DataType | str

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.type, "ValueState type")


@dataclass(frozen=True)
class ListState:
    """A list of values per key; ``add`` appends."""

    element_type: pa.DataType | str

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.list_(arrow_type(self.element_type, "ListState element type"))


@dataclass(frozen=True)
class MapState:
    """A map per key; ``put`` inserts or replaces entries."""

    key_type: pa.DataType | str
    value_type: pa.DataType | str

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.map_(
            arrow_type(self.key_type, "MapState key type"), arrow_type(self.value_type, "MapState value type")
        )


StateDescriptor = ValueState | ListState | MapState
