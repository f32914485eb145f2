"""The worker protocol every keyed kind runs by: open, process a batch, finish, close.

A keyed subtask's runner (:class:`keyflow.runtime.workers.KeyedRunner`) drives one
:class:`KeyedFunction`: ``open`` once per subtask run, ``process`` for each batch of keys
with their state, ``finish`` at the end of the subtask's input with the keys the run
touched (a running aggregate emits them there), ``advance`` when time moved on (timers and
windows fire there), and ``close`` last. A result of None emits nothing; any other result is conformed to the
operator's schema. A user's ``process`` function is run through
:class:`keyflow.runtime.workers.UserProcess`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa

from keyflow.state.keyed import KeyedBatch, KeyedState
from keyflow.state.memory import KeyedStateStore
from keyflow.state.timers import TaskTime


class KeyedFunction:
    """A keyed operator's function in the workers; kinds override what they need."""

    finishes: ClassVar[bool] = False  # whether ``finish`` may emit (only then are the touched keys gathered)
    timed: ClassVar[bool] = False  # whether ``advance`` runs at every micro-batch, with rows or without

    def open(self, subtask: int, key_groups: tuple[int, int]) -> None:
        """Before the subtask's first batch (its index and key-group range)."""

    def process(self, batch: KeyedBatch, state: KeyedState) -> Any:
        """Rows of a batch of keys, with those keys' state: the rows to emit, or None."""
        raise NotImplementedError

    def finish(self, keys: pa.Table, state: KeyedState) -> Any:
        """After the subtask's last batch, with the keys this run touched: rows, or None."""
        return None

    def advance(self, time: TaskTime, store: KeyedStateStore) -> Iterator[Any]:
        """After ``finish``, time advanced to ``time``: fire what is due (timers, windows) over
        the whole subtask's state, not only the keys that had rows; each result is emitted."""
        return iter(())

    def close(self) -> None:
        """After ``finish`` and after the state was written."""
