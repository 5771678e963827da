"""Reprotrain service: the command line today; the API and dashboard build on it."""
