"""Custom components trained by Reprotrain from a code bundle (`repro code push`)."""
