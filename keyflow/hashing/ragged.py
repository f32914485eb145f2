"""Walk variable-length rows position by position, never row by row.

Byte-wise hashes (Spark's over UTF-8, Java's over UTF-16) consume each row's elements
in order. Sorting rows longest first makes the rows still active at position ``j`` a
prefix of that order, so each step is a slice of the running hashes, not a Python loop
over rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

Index = npt.NDArray[np.intp]


class RaggedRows:
    """Rows ordered longest first, with how many are still active at each position."""

    def __init__(self, lengths: npt.NDArray[np.integer]) -> None:
        self.order: Index = np.argsort(-lengths, kind="stable")
        sorted_lengths = lengths[self.order]
        longest = int(sorted_lengths[0]) if len(sorted_lengths) else 0
        self._active = np.searchsorted(-sorted_lengths, -np.arange(1, longest + 1), side="right")

    def positions(self) -> Iterator[tuple[int, int]]:
        """``(position, active_rows)``: the first ``active_rows`` of :attr:`order` have an
        element at ``position``."""
        for position, active in enumerate(self._active):
            yield position, int(active)

    def unsort(self, sorted_values: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        """Put per-row values computed in :attr:`order` back into row order."""
        values = np.empty_like(sorted_values)
        values[self.order] = sorted_values
        return values
