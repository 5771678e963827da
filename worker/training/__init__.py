"""Training one job: set-up, determinism, seeds, replicas, the step and epoch loops, and
the progress events it writes."""
