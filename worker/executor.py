"""The process executor: one job, one fresh `python -m worker.run` subprocess.

TensorFlow-free; the caller gets progress events as they arrive and the result document.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.progress import parse_line
from worker.result import JobResult, read_result

EventHandler = Callable[[dict[str, Any]], None]


def job_command(
    spec: Path,
    out: Path,
    *,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    max_model_parameters: int | None = None,
    trace_every_steps: int | None = None,
    until_epoch: int | None = None,
) -> list[str]:
    """The command line that runs one job with this interpreter."""
    cmd = [sys.executable, "-m", "worker.run", "--spec", str(spec), "--out", str(out)]
    if trace_every_steps is not None:
        cmd += ["--trace-every-steps", str(trace_every_steps)]
    if until_epoch is not None:
        cmd += ["--until-epoch", str(until_epoch)]
    if max_model_parameters is not None:
        cmd += ["--max-model-parameters", str(max_model_parameters)]
    if checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(checkpoint_dir)]
    if resume:
        cmd.append("--resume")
    return cmd


def run_process_job(
    spec: Path,
    out: Path,
    *,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    on_event: EventHandler | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[int, JobResult]:
    """Run the job to completion; returns the exit code and the result it wrote.

    Progress lines go to `on_event`; the job's other stderr lines go to `log`.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with subprocess.Popen(
        job_command(spec, out, checkpoint_dir=checkpoint_dir, resume=resume),
        env=env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            event = parse_line(line.rstrip("\n"))
            if event is not None:
                if on_event is not None:
                    on_event(event)
            elif log is not None:
                log(line.rstrip("\n"))
        code = proc.wait()
    return code, read_result(out)
