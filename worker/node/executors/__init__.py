"""Executors run one job each: `process` (a fresh subprocess) or `docker` (a fresh container)."""

from __future__ import annotations

import importlib
from typing import Any, cast

from worker.node.executors.base import Executor, JobHandle, JobRequest

KINDS = ("process", "docker")

__all__ = ["KINDS", "Executor", "ExecutorUnavailable", "JobHandle", "JobRequest", "make_executor"]


class ExecutorUnavailable(Exception):
    """This worker cannot use the executor it was asked for (unknown, or not installed)."""


def make_executor(kind: str, **options: Any) -> Executor:
    """The executor of `kind`, configured with `options`; ExecutorUnavailable if it cannot be."""
    if kind == "process":
        from worker.node.executors.process import ProcessExecutor

        return ProcessExecutor(**options)
    if kind == "docker":
        # Imported only here: the docker SDK is needed only by workers that use it.
        try:
            module = importlib.import_module("worker.node.executors.docker")
        except ModuleNotFoundError as exc:
            raise ExecutorUnavailable(
                f"the docker executor is not available in this installation ({exc})"
            ) from exc
        return cast(Executor, module.DockerExecutor(**options))
    raise ExecutorUnavailable(f"unknown executor {kind!r}; choose one of {', '.join(KINDS)}")
