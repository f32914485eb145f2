"""What users write: pipelines, streams, keyed operators and their state."""
