"""Key-group assignment speed.

1. Flink hashing of 1M int64 and 1M string keys: keyflow's vectorised NumPy path
   against a plain-Python loop over keys with the same Java semantics (the peer).
2. Key groups of 10M rows inside Spark: keyflow's JVM-native ``pmod(hash(key), K)``
   against the same key groups computed by a PySpark pandas UDF (Arrow, Python workers).

Run: ``make bench`` (or ``.venv/bin/python -m bench.keygroups``). One JSON line per figure.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf

from bench.report import best_seconds, emit, progress
from keyflow.keygroups import assign_to_key_groups
from keyflow.runtime.keygroups import key_group_column
from keyflow.runtime.session import spark_session
from tests import java_reference as plain_python

K = 27720


def bench_flink_hashing(keys: int, peer_sample: int) -> None:
    rng = np.random.default_rng(1)
    longs = rng.integers(-(2**63), 2**63 - 1, keys, dtype=np.int64)
    strings = pa.array([f"user-{n}" for n in rng.integers(0, 10**9, keys)])
    cases = [
        ("flink_hash_int64", longs, lambda v: plain_python.flink_key_group(plain_python.long_hash_code(v), K)),
        ("flink_hash_string", strings, lambda v: plain_python.flink_key_group(plain_python.string_hash_code(v), K)),
    ]
    for metric, values, one_key in cases:
        progress(f"{metric}: {keys:,} keys vectorised, {peer_sample:,} keys in a Python loop")
        seconds = best_seconds(lambda values=values: assign_to_key_groups(values, K, hash="flink"))
        sample = values[:peer_sample].tolist()
        peer_seconds = best_seconds(lambda sample=sample, one_key=one_key: [one_key(v) for v in sample], repeats=1)
        emit("keygroups", metric, "keys/s", keys / seconds, "python-loop", peer_sample / peer_seconds)


def bench_spark_key_groups(rows: int) -> None:
    spark = spark_session({"spark.master": "local[2]"}, app_name="keyflow-bench")
    frame = spark.range(rows).select(F.concat(F.lit("user-"), (F.col("id") % 1_000_000).cast("string")).alias("user"))

    @pandas_udf("int")
    def key_group_udf(users: pd.Series) -> pd.Series:
        return pd.Series(assign_to_key_groups(pa.array(users), K, hash="spark"))

    def run(key_group: F.Column) -> None:
        frame.select("user", key_group.alias("kg")).write.format("noop").mode("overwrite").save()

    progress(f"spark key groups: {rows:,} rows, JVM expression vs pandas UDF")
    native = best_seconds(lambda: run(key_group_column(["user"], K)))
    udf = best_seconds(lambda: run(key_group_udf("user")))
    emit("keygroups", "spark_key_groups", "rows/s", rows / native, "pyspark-pandas-udf", rows / udf)
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys per hashing case")
    parser.add_argument("--peer-sample", type=int, default=100_000, help="keys the Python loop hashes")
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows for the Spark case")
    args = parser.parse_args()
    bench_flink_hashing(args.keys, args.peer_sample)
    bench_spark_key_groups(args.rows)


if __name__ == "__main__":
    main()
