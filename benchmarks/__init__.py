"""Benchmarks: what verifiable reproducibility costs, each figure a ratio to a baseline
measured in the same run. `python -m benchmarks` runs them all (see README.md here)."""
