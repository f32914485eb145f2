"""What checkpoint integrity costs a streaming job: checksums and checks per micro-batch.

Runs the streaming benchmark's keyed running count+sum (``bench.streaming_state``: one
Parquet file of ``--rows-per-file`` rows per micro-batch, 1M keys) through keyflow, then
times, on that run's real checkpoint, every piece of integrity work a micro-batch does:

- workers hash the state bytes they write (xxh3 over the batch's state files, timed here
  over the same bytes);
- the driver copies the plan into the manifest, seals the manifest, and checks the retained
  versions when it applies retention (one listing, no data read);
- after a restart or rescale, workers hash the state they restore (all of it, once);

and compares their sum with the median micro-batch time of the same run. Target: ≤ 3 %.
Also: the check before a start (listing + newest manifest) and a deep verify's rate.
Run ``.venv/bin/python -m bench.checkpoint_integrity`` (3 repeats; best and median printed).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.report import emit, progress
from bench.streaming_state import keyflow_run, uniform_batches, write_batches
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.integrity import check_before_restore, verify
from keyflow.state.plan_file import read_plan_file
from keyflow.state.seal import checksum

BENCH = "checkpoint_integrity"


def timed(action: Callable[[], object], repeats: int = 20) -> float:
    """Median seconds of ``action`` (small, fast pieces: many repeats)."""
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def retained_bytes(checkpoint: Checkpoint) -> int:
    """Bytes a deep verify reads: every file of every retained version (once per version)."""
    versions = [checkpoint.manifests.read(version) for version in checkpoint.manifests.versions()]
    return sum(size or 0 for manifest in versions for size, _ in manifest.needed().values())


def one_run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    data = work / "data"
    if not data.exists():
        write_batches(data, uniform_batches(args.files, args.rows_per_file, args.keys, seed=7), seed=7)
    shutil.rmtree(work / "kf", ignore_errors=True)
    batches = keyflow_run(data, work / "kf", args.parallelism)
    steady = batches[1:]
    checkpoint = Checkpoint(str(work / "kf" / "ckpt"))
    newest = checkpoint.manifests.read(checkpoint.manifests.versions()[-1])
    written = [f for files in newest.operators.values() for f in files if f.version == newest.version]
    contents = [(Path(checkpoint.path(f.path))).read_bytes() for f in written]
    hash_rate = sum(map(len, contents)) / timed(lambda: [checksum(c) for c in contents])  # bytes/s
    hashing = statistics.median(b.state_bytes_written for b in steady) / hash_rate
    plan_file = read_plan_file(checkpoint)
    assert plan_file is not None
    driver = timed(plan_file.to_dict) + timed(newest.to_json) + timed(lambda: verify(checkpoint))
    return {
        "batch": statistics.median(b.seconds for b in steady),
        "per_batch": hashing + driver,
        "hashing": hashing,
        "driver": driver,
        "start_check": timed(lambda: check_before_restore(checkpoint)),
        "restore_hashing": sum(size or 0 for size, _ in newest.needed().values()) / hash_rate,
        "first_batch": batches[0].seconds,
        "deep_rate": retained_bytes(checkpoint) / timed(lambda: verify(checkpoint, deep=True), repeats=3),
        "state_bytes": float(statistics.median(b.state_bytes_written for b in steady)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--rows-per-file", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="keyflow-bench-"))
    try:
        runs = []
        for number in range(args.repeats):
            progress(f"run {number + 1}/{args.repeats}: {args.files} micro-batches, {args.keys:,} keys")
            runs.append(one_run(work, args))
        shares = sorted(run["per_batch"] / run["batch"] for run in runs)
        best, median = runs[[r["per_batch"] / r["batch"] for r in runs].index(shares[0])], statistics.median(shares)
        label = f"running count+sum {args.keys} keys, {args.rows_per_file} rows/batch"
        emit(BENCH, f"{label}: checksum and check work per micro-batch (best run)", "ms", 1e3 * best["per_batch"],
             "keyflow median micro-batch time, same run", 1e3 * best["batch"])  # fmt: skip
        emit(BENCH, f"{label}: checksum and check share of batch time, median of {args.repeats} runs", "ratio",
             median, None, None)  # fmt: skip
        emit(BENCH, f"{label}: of which workers hash state written ({best['state_bytes']:,.0f} bytes)", "ms",
             1e3 * best["hashing"], None, None)  # fmt: skip
        emit(BENCH, f"{label}: of which driver (plan copy, seal, retention check)", "ms", 1e3 * best["driver"],
             None, None)  # fmt: skip
        emit(BENCH, "check before a start (plan.json, newest manifest, listing)", "ms", 1e3 * best["start_check"],
             "keyflow median micro-batch time, same run", 1e3 * best["batch"])  # fmt: skip
        restore = f"{label}: workers hash the whole state they restore after a restart"
        emit(BENCH, restore, "ms", 1e3 * best["restore_hashing"], "keyflow first micro-batch time, same run",
             1e3 * best["first_batch"])  # fmt: skip
        emit(BENCH, "deep verify (read and hash every retained file)", "MB/s", best["deep_rate"] / 1e6, None, None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
