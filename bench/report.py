"""One JSON line per figure, the shape every keyflow benchmark prints."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any


def emit(bench: str, metric: str, unit: str, keyflow: float, peer: str | None, peer_value: float | None) -> None:
    """Print a figure; ``ratio`` is keyflow / peer_value (for rates, above 1 means keyflow is faster)."""
    ratio = round(keyflow / peer_value, 3) if peer_value else None
    line: dict[str, Any] = {
        "bench": bench,
        "metric": metric,
        "unit": unit,
        "keyflow": round(keyflow, 3),
        "peer": peer,
        "peer_value": None if peer_value is None else round(peer_value, 3),
        "ratio": ratio,
    }
    print(json.dumps(line), flush=True)


def best_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    """Fastest of ``repeats`` wall-clock runs (the least disturbed by the machine)."""
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return min(timings)


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
