"""Verdicts: the server's own checks of a reported result, comparison reports, and the
verdict of each rerun against its family's reference."""
