"""Sources and sinks: datagen, filesystem (Parquet, JSON lines, CSV) and console."""
