"""Shared helpers for pipeline tests: input files made with NumPy/pandas, not keyflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

TEST_SPARK = {"spark.master": "local[2]", "pipeline.progress": "off"}
# A batch run at exactly its parallelism, for tests of Flink's key-group ranges at P (batch
# runs otherwise decide P from their input's bytes: execution.batch.adaptive.auto-parallelism).
FIXED = {"execution.batch.adaptive.auto-parallelism.enabled": False}


def write_clicks(path: Path, rows: int = 20_000, users: int = 300, seed: int = 3) -> pd.DataFrame:
    """Skewed click events as Parquet (two files), returned as pandas for expected answers."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "user": [f"u{n}" for n in rng.zipf(1.3, rows) % users],
            "page": rng.choice(["home", "cart", "help"], rows),
            "price": np.round(rng.uniform(-10, 100, rows), 2),
            "ts": pd.Timestamp("2026-11-01") + pd.to_timedelta(rng.permutation(rows), unit="s"),
            "n": np.arange(rows, dtype=np.int64),
        }
    )
    path.mkdir(parents=True, exist_ok=True)
    half = rows // 2
    # Spark reads microsecond timestamps; pandas would write nanoseconds.
    frame.iloc[:half].to_parquet(path / "part-0.parquet", index=False, coerce_timestamps="us")
    frame.iloc[half:].to_parquet(path / "part-1.parquet", index=False, coerce_timestamps="us")
    return frame
