"""State descriptors: the per-key state a ``process`` function declares up front.

Declaring state (name and Arrow type) before the pipeline runs lets keyflow validate it,
store it by key group and, in streaming, persist and restore it across rescales. They are
part of the plan: a restore matches each operator's declared state with the checkpoint's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from keyflow.errors import PlanError
from keyflow.plan.durations import duration


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


UPDATE_TYPES = ("OnCreateAndWrite", "OnReadAndWrite")


@dataclass(frozen=True)
class StateTtlConfig:
    """Flink's ``StateTtlConfig``: a state value expires ``ttl`` after it was last written (and,
    with ``update_type="OnReadAndWrite"``, read), in processing time. An expired value is never
    returned (Flink's ``NeverReturnExpired``, the only visibility offered); it is removed when
    its key's subtask next runs or compacts, so the state's size falls."""

    ttl: Any
    update_type: str = "OnCreateAndWrite"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl", duration(self.ttl, "StateTtlConfig ttl", zero=False))
        if self.update_type not in UPDATE_TYPES:
            raise PlanError(
                f"StateTtlConfig update_type={self.update_type!r} is invalid; choose one of {', '.join(UPDATE_TYPES)}"
            )

    @property
    def micros(self) -> int:
        return int(self.ttl)


def ttl_column(state: str) -> str:
    """The hidden column holding when each key's ``state`` was last written (or read)."""
    return f"__ttl_{state}"


@dataclass(frozen=True)
class ValueState:
    """One value per key; ``ttl``: a :class:`StateTtlConfig`."""

    type: pa.DataType | str
    ttl: StateTtlConfig | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.type, "ValueState type")


@dataclass(frozen=True)
class ListState:
    """A list of values per key; ``add`` appends."""

    element_type: pa.DataType | str
    ttl: StateTtlConfig | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.list_(arrow_type(self.element_type, "ListState element type"))


@dataclass(frozen=True)
class MapState:
    """A map per key; ``put`` inserts or replaces entries."""

    key_type: pa.DataType | str
    value_type: pa.DataType | str
    ttl: StateTtlConfig | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.map_(
            arrow_type(self.key_type, "MapState key type"), arrow_type(self.value_type, "MapState value type")
        )


StateDescriptor = ValueState | ListState | MapState


def with_ttl_columns(state: Mapping[str, StateDescriptor]) -> dict[str, StateDescriptor]:
    """The declared states and, for each with a TTL, the hidden column of its write times."""
    columns: dict[str, StateDescriptor] = dict(state)
    for name, descriptor in state.items():
        if descriptor.ttl is not None:
            columns[ttl_column(name)] = ValueState(pa.int64())
    return columns
