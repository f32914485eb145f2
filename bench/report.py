"""One JSON line per figure, the shape every keyflow benchmark prints."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
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


def alternating_seconds(runs: dict[str, Callable[[], object]], repeats: int = 3) -> dict[str, list[float]]:
    """Wall-clock seconds of each run, ``repeats`` rounds with the runs alternating, so a slow
    spell of a shared machine falls on both sides."""
    timings: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            timings[name].append(time.perf_counter() - start)
    return timings


def emit_best_and_median(
    bench: str, metric: str, unit: str, keyflow: list[float], peer: str, peer_values: list[float]
) -> None:
    """Two lines per figure: the best (least disturbed) of the runs and their median."""
    emit(bench, f"{metric} (best of {len(keyflow)})", unit, min(keyflow), peer, min(peer_values))
    emit(bench, f"{metric} (median of {len(keyflow)})", unit, statistics.median(keyflow), peer,
         statistics.median(peer_values))  # fmt: skip


class PeakWorkerMemory:
    """The largest resident memory (bytes) of any of Spark's Python workers while the block
    runs, sampled from /proc every 50 ms (Linux; sampling costs a few % of a core, so time
    runs without it): workers are the children of PySpark's daemon."""

    def __init__(self) -> None:
        self.peak = 0
        self._running = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakWorkerMemory:
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._running = False
        assert self._thread is not None
        self._thread.join()

    def _sample(self) -> None:
        while self._running:
            self.peak = max(self.peak, *_worker_rss(), 0)
            time.sleep(0.05)


def _worker_rss() -> list[int]:
    daemons, rss = set(), {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            command = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue  # the process ended
        if b"pyspark.daemon" in command:
            pid, parent = int(status.parent.name), int(fields["PPid"])
            daemons.add(pid)
            rss[pid] = (parent, int(fields.get("VmRSS", "0 kB").split()[0]) * 1024)
    return [size for parent, size in rss.values() if parent in daemons]


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
