"""What a job records: fingerprints, traces, checkpoints, provenance and environment capture."""
