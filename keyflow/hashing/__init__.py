"""Key hashing, vectorised: Flink's ``hashCode`` + murmur and Spark's Murmur3 ``hash()``."""
