"""The tables and views a pipeline's SQL knows, owned by the SQL layer, one per plan builder.

The Python API registers views here (``Pipeline.create_temporary_view``) and holds no SQL
state of its own; a catalog lives as long as the builder whose nodes its views name.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from keyflow.errors import PlanError
from keyflow.plan.builder import PlanBuilder
from keyflow.sql.dialect import WindowTableFunction
from keyflow.sql.statements import CreateTable, CreateView

_catalogs: weakref.WeakKeyDictionary[PlanBuilder, Catalog] = weakref.WeakKeyDictionary()


@dataclass
class Catalog:
    """Declared tables, SQL views and Python streams registered as views."""

    tables: dict[str, CreateTable] = field(default_factory=dict)
    queries: dict[str, CreateView] = field(default_factory=dict)  # CREATE VIEW, planned where first read
    views: dict[str, int] = field(default_factory=dict)  # name -> node id of a stream
    read: dict[str, int] = field(default_factory=dict)  # table or SQL view -> node id of its rows
    columns: dict[str, list[str] | None] = field(default_factory=dict)  # table or SQL view -> its columns
    written: set[str] = field(default_factory=set)
    windowed: dict[int, WindowTableFunction] = field(default_factory=dict)  # rows whose windows a reader makes
    proctime: dict[int, set[str]] = field(default_factory=dict)  # node -> its PROCTIME() columns
    types: dict[int, dict[str, Any]] = field(default_factory=dict)  # a table's node -> its declared types

    def __contains__(self, name: object) -> bool:
        """Whether a table or a view is named ``name``."""
        return name in self.tables or name in self.views or name in self.queries

    def create_view(self, name: str, node_id: int) -> None:
        """Make the stream of ``node_id`` readable as ``FROM name``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise PlanError(f"view name {name!r} must be an identifier such as 'clicks'")
        if name in self:
            raise PlanError(f"a table or view named {name!r} exists already; choose another name")
        self.views[name] = node_id


def catalog_of(builder: PlanBuilder) -> Catalog:
    """The catalog of ``builder``'s SQL (empty until a statement or a view adds to it)."""
    return _catalogs.setdefault(builder, Catalog())
