"""Comparing two runs: the verdict, numeric differences and spec differences.

TensorFlow-free (NumPy and the standard library): the API builds its reports with it.
"""
