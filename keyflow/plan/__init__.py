"""The job plan: vertices with parallelism and max parallelism, edges with partitioners."""
