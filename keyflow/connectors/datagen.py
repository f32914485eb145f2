"""``datagen``: generated rows, computed by Spark from the row number.

Every value is a function of ``(row id, field, seed)`` through Spark's ``xxhash64``, not of
``rand()`` (whose values depend on partitioning), so the same seed gives the same rows
at any parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from keyflow.errors import PlanError, positive_option
from keyflow.schemas import Type, arrow_type

_MANTISSA = (1 << 53) - 1


@dataclass(frozen=True)
class Field:
    """How to generate one column."""

    kind: str
    params: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        return f"{self.kind}({', '.join(f'{k}={v!r}' for k, v in self.params)})"

    @property
    def type(self) -> Type:
        """What the plan checks know of the column's type before Spark computes it."""
        p = dict(self.params)
        match self.kind:
            case "random_string":
                return "string"
            case "zipf" if p["prefix"] is not None:
                return "string"
            case "timestamp":
                return "timestamp"
            case "choice":
                return _choice_type(p["values"])
        return "numeric"

    def column(self, row: Column, uniform: Column) -> Column:
        p = dict(self.params)
        match self.kind:
            case "sequence":
                return row * F.lit(p["step"]) + F.lit(p["start"])
            case "random_int":
                return F.floor(uniform * F.lit(p["high"] - p["low"] + 1)).cast("long") + F.lit(p["low"])
            case "random_float":
                return uniform * F.lit(p["high"] - p["low"]) + F.lit(p["low"])
            case "random_string":
                return F.substring(
                    F.sha2(F.concat_ws(":", uniform.cast("string"), row.cast("string")), 256), 1, p["length"]
                )
            case "choice":
                values = F.array(*[F.lit(value) for value in p["values"]])
                return F.element_at(values, F.floor(uniform * F.lit(len(p["values"]))).cast("int") + F.lit(1))
            case "zipf":
                return _zipf(uniform, p["n"], p["exponent"], p["prefix"])
            case "timestamp":
                return F.timestamp_micros(F.lit(p["start_micros"]) + row * F.lit(p["step_ms"] * 1000))
        raise AssertionError(self.kind)


def _choice_type(values: tuple[Any, ...]) -> Type:
    try:
        return arrow_type(pa.array(values).type)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # mixed values: Spark decides


def _zipf(uniform: Column, n: int, exponent: float, prefix: str | None) -> Column:
    """Keys 1..n with P(k) ~ 1/k^s, by inverting the continuous power law on [1, n + 1)."""
    if abs(exponent - 1.0) < 1e-9:
        value = F.exp(uniform * F.lit(math.log(n + 1)))
    else:
        one_minus = 1.0 - exponent
        span = (n + 1) ** one_minus - 1.0
        value = F.pow(uniform * F.lit(span) + F.lit(1.0), F.lit(1.0 / one_minus))
    key = F.least(F.floor(value).cast("long"), F.lit(n))
    return F.concat(F.lit(prefix), key.cast("string")) if prefix is not None else key


def sequence(start: int = 0, step: int = 1) -> Field:
    """``start, start + step, ...`` by row number."""
    return Field("sequence", (("start", start), ("step", step)))


def random_int(low: int, high: int) -> Field:
    """Uniform integers in ``[low, high]``."""
    if not all(isinstance(bound, int) and not isinstance(bound, bool) for bound in (low, high)):
        raise PlanError(f"random_int(low={low!r}, high={high!r}) needs integers; use random_float for fractions")
    if high < low:
        raise PlanError(f"random_int(low={low}, high={high}) is empty; high must be >= low")
    return Field("random_int", (("low", low), ("high", high)))


def random_float(low: float = 0.0, high: float = 1.0) -> Field:
    """Uniform doubles in ``[low, high)``."""
    if high < low:
        raise PlanError(f"random_float(low={low}, high={high}) is empty; high must be >= low")
    return Field("random_float", (("low", low), ("high", high)))


def random_string(length: int = 8) -> Field:
    """Hex strings of ``length`` characters (1..64)."""
    if not 1 <= length <= 64:
        raise PlanError(f"random_string(length={length}) is invalid; length must be 1..64")
    return Field("random_string", (("length", length),))


def choice(values: list[Any] | tuple[Any, ...]) -> Field:
    """One of ``values``, uniformly."""
    if not values:
        raise PlanError("choice(values=[]) has nothing to choose from; give at least one value")
    return Field("choice", (("values", tuple(values)),))


def zipf(n: int, exponent: float = 1.1, prefix: str | None = None) -> Field:
    """Skewed keys ``1..n`` (key 1 the most frequent); with ``prefix``, strings like ``user-1``."""
    if n < 1 or exponent <= 0:
        raise PlanError(f"zipf(n={n}, exponent={exponent}) is invalid; n must be >= 1 and exponent > 0")
    return Field("zipf", (("n", n), ("exponent", exponent), ("prefix", prefix)))


def timestamp(start: str = "2026-01-01 00:00:00", step_ms: int = 1000) -> Field:
    """Timestamps ``start + row * step_ms`` milliseconds; ``start`` is ISO 8601, UTC unless it
    names an offset, so runs repeat on machines in any time zone."""
    try:
        moment = datetime.fromisoformat(start)
    except ValueError:
        raise PlanError(f"timestamp(start={start!r}) is not an ISO 8601 time such as '2026-01-01 00:00:00'") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    micros = round(moment.timestamp() * 1_000_000)
    return Field("timestamp", (("start", start), ("step_ms", step_ms), ("start_micros", micros)))


class DatagenSource:
    """Generated rows: ``rows`` of them at once (bounded), or released at ``rows_per_second``
    (unbounded; ``rows`` then caps the total)."""

    def __init__(
        self,
        rows: int | None,
        fields: dict[str, Field],
        seed: int = 0,
        rows_per_second: float | None = None,
        rows_per_batch: int | None = None,
    ) -> None:
        if rows is None and rows_per_second is None:
            raise PlanError("datagen needs rows=N (bounded) or rows_per_second=R (unbounded)")
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise PlanError(f"datagen rows={rows!r} is invalid; it must be a non-negative integer")
        if rows_per_second is not None and (isinstance(rows_per_second, bool) or not rows_per_second > 0):
            raise PlanError(f"datagen rows_per_second={rows_per_second!r} is invalid; it must be a positive number")
        positive_option(rows_per_batch, "datagen rows_per_batch")
        if not fields:
            raise PlanError("datagen needs fields, e.g. fields={'user': zipf(10_000, prefix='user-')}")
        for name, field in fields.items():
            if not isinstance(field, Field):
                raise PlanError(f"datagen field {name!r} is {field!r}; use sequence(), random_int(), zipf(), ...")
        self.rows, self.fields, self.seed = rows, dict(fields), seed
        self.rows_per_second, self.rows_per_batch = rows_per_second, rows_per_batch

    @property
    def unbounded(self) -> bool:
        return self.rows_per_second is not None

    def describe(self) -> dict[str, Any]:
        fields = {name: field.describe() for name, field in self.fields.items()}
        described: dict[str, Any] = {"connector": "datagen", "rows": self.rows, "seed": self.seed, "fields": fields}
        if self.unbounded:
            described.update(rows_per_second=self.rows_per_second, rows_per_batch=self.rows_per_batch)
        return described

    def column_names(self) -> tuple[str, ...]:
        return tuple(self.fields)

    def column_types(self) -> dict[str, Type]:
        return {name: field.type for name, field in self.fields.items()}

    def read(self, spark: SparkSession, parallelism: int) -> DataFrame:
        """Exactly ``parallelism`` partitions of generated rows."""
        return self._generate(spark.range(0, self.rows or 0, 1, numPartitions=parallelism))

    def read_stream(self, spark: SparkSession, parallelism: int) -> DataFrame:
        """Row numbers from a streaming source, ``parallelism`` partitions per micro-batch."""
        from keyflow.connectors.streams import row_numbers

        assert self.rows_per_second is not None  # unbounded
        return self._generate(row_numbers(spark, parallelism, self.rows_per_second, self.rows, self.rows_per_batch))

    def _generate(self, ids: DataFrame) -> DataFrame:
        row = F.col("id")
        columns = [field.column(row, uniform(row, self.seed, i)).alias(name) for i, (name, field) in
                   enumerate(self.fields.items())]  # fmt: skip
        return ids.select(*columns)


def uniform(row: Column, seed: int, field: int) -> Column:
    """A draw in [0, 1) that is a function of (row, seed, field) only: the same at any parallelism."""
    bits = F.xxhash64(row, F.lit(seed), F.lit(field)).bitwiseAND(F.lit(_MANTISSA))
    return bits.cast("double") / F.lit(float(1 << 53))


def datagen(
    rows: int | None = None,
    fields: dict[str, Field] | None = None,
    seed: int = 0,
    rows_per_second: float | None = None,
    rows_per_batch: int | None = None,
) -> DatagenSource:
    """Generated rows: ``datagen(rows=1_000_000, fields={"user": zipf(10_000, prefix="user-")}, seed=7)``.

    With ``rows_per_second`` the source is unbounded (a streaming pipeline); ``rows`` then
    stops it after that many rows and ``rows_per_batch`` caps each micro-batch.
    """
    return DatagenSource(rows, fields or {}, seed, rows_per_second, rows_per_batch)
