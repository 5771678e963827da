"""What the server stores by content: artifacts (checkpoints, logs) and datasets."""
