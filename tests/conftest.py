from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from keyflow.runtime.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A real local Spark with two cores, shared by the whole test session."""
    session = spark_session({"spark.master": "local[2]", "spark.sql.shuffle.partitions": "4"}, app_name="keyflow-tests")
    yield session
    session.stop()
