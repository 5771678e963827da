"""A job interpreter started before its job: `python -m worker.training.warm_run --ready-fd N`.

The process executor of an idle worker starts one, so the next job does not wait for the
interpreter and TensorFlow's imports. It imports what every job imports, and nothing more:
the TensorFlow runtime is not initialised by an import (no thread pools, devices, op
determinism or seeds), so the job sets all of that from its spec exactly as a fresh process
does. It says it is ready by closing fd N, then waits on stdin for one line of JSON,
`{"argv": [...], "env": {...}}`: the job's `worker.run` arguments and its whole environment,
of which only variables read after start-up may differ from the one it was started with
(the executor checks that). End of input without a line: it exits without running anything.
"""

from __future__ import annotations

import os

# Before any import: TensorFlow sets variables of its own when imported, which a job started
# cold has too, so only the difference between the two environments is applied.
_STARTED_WITH = dict(os.environ)

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

JOB_MODULES = (
    "worker.run",
    "worker.models.registry",
    "worker.record.provenance",
    "worker.training.loop",
)


class NotWarmable(RuntimeError):
    """The imports initialised what a job must set itself: this process cannot take a job."""


def _import_job_modules() -> None:
    """Import what a job imports before it sets anything from its spec."""
    # In the order a cold job imports them.
    for module in JOB_MODULES:
        importlib.import_module(module)
    from tensorflow.python.eager import context

    # Thread pools, devices and op determinism are fixed when the runtime initialises; a job
    # must find it uninitialised, as it would in a fresh process.
    if context.context()._initialized:
        raise NotWarmable("the TensorFlow runtime was initialised by the imports")


def _apply_environment(wanted: Mapping[str, str]) -> None:
    """Make os.environ what a cold job would have: its environment plus TensorFlow's own."""
    for name in set(_STARTED_WITH) - set(wanted):
        os.environ.pop(name, None)
    for name, value in wanted.items():
        if _STARTED_WITH.get(name) != value:
            os.environ[name] = value


def _read_job() -> dict[str, Any] | None:
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    job = json.loads(line)
    if not isinstance(job, dict) or not isinstance(job.get("argv"), list):
        raise ValueError("the hand-over line must be {'argv': [...], 'env': {...}}")
    return job


def main(argv: list[str] | None = None) -> int:
    """Entry point: import, say ready, wait for a job and run it; returns its exit code."""
    parser = argparse.ArgumentParser(prog="python -m worker.training.warm_run")
    parser.add_argument("--ready-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _import_job_modules()
    os.close(args.ready_fd)
    job = _read_job()
    if job is None:
        return 0
    # A job's stdin is empty, as a cold job's is.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _apply_environment({str(k): str(v) for k, v in (job.get("env") or {}).items()})
    import worker.run as run

    job_argv = [str(a) for a in job["argv"]]
    sys.argv = [str(run.__file__), *job_argv]
    run._STARTED = time.monotonic()  # the job's start-up counts from its hand-over
    return run.main(job_argv)


if __name__ == "__main__":
    code = main()
    from worker.run import exit_now  # imported with the job's modules

    exit_now(code)  # the job's result is out: its teardown can be skipped, as a cold job's is
