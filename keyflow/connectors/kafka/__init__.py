"""Apache Kafka: a source whose partitions are splits, sinks with Kafka transactions, a local broker."""
