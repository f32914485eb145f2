"""keyflow: keyed, stateful pipelines on Apache Spark with Flink's parallelism model."""

__version__ = "0.1.0"
