"""Runs: submitting experiments and reruns, the queue and its leases, waiting claims,
resume points, run events and the wake-ups behind them, and reproducibility audits."""
