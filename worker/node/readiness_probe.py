"""Running the reproducibility checks (`python -m worker.record.readiness --json`) where jobs run:
in a fresh process, as the process executor runs jobs, or in a container of a worker image
under the docker executor's conventions (no network, read-only root, no capabilities, never
root, the GPUs through the NVIDIA runtime, the same determinism environment).

A fresh interpreter either way: the checks import TensorFlow, which the agent and the
command line never do.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("reprotrain.agent")

READINESS_ARGS = ("-m", "worker.record.readiness", "--json")
# Importing TensorFlow and listing GPUs takes seconds; a hung driver must not hold a worker.
PROBE_TIMEOUT_SECONDS = 180.0
_FLAG_CHECK_CHARS = 40
_FLAG_MESSAGE_CHARS = 1000


def parse_report(stdout: str) -> dict[str, Any]:
    """The report a check printed (its last line of JSON); ValueError if there is none."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the checks printed nothing")
    report = json.loads(lines[-1])
    if not isinstance(report, dict) or not isinstance(report.get("flags"), list):
        raise ValueError("the checks printed no report")
    return report


def registration_flags(report: Mapping[str, Any], limit: int = 32) -> list[dict[str, str]]:
    """A report's flags cut to what a registration carries (a server refuses longer ones)."""
    flags = []
    for flag in list(report.get("flags") or [])[:limit]:
        check = str(flag.get("check") or "check")[:_FLAG_CHECK_CHARS]
        message = str(flag.get("message") or "")[:_FLAG_MESSAGE_CHARS] or "flagged"
        flags.append({"check": check, "message": message})
    return flags


def in_process(*, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run the checks in a fresh interpreter with the environment a process job gets."""
    from worker.node.executors.process import job_environment
    from worker.node.executors.process_isolation import pdeathsig_preexec

    dies_with_parent = pdeathsig_preexec()

    def preexec() -> None:
        os.nice(10)  # a check, not a job: it yields the CPU to the jobs and servers here
        if dies_with_parent is not None:
            dies_with_parent()  # an agent killed mid-check leaves nothing running

    proc = subprocess.run(
        [sys.executable, *READINESS_ARGS],
        env=job_environment(environ),
        preexec_fn=preexec,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_SECONDS,
        check=False,
    )
    return parse_report(proc.stdout)


def container_options(
    image_id: str, *, gpus: bool, user: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`containers.create` arguments of a checks container, as the docker executor makes a
    job's: the same environment, sandbox and GPU request."""
    from docker.types import DeviceRequest

    from worker.node.executors.docker import container_environment

    env = container_environment(None if environ is None else dict(environ))
    device_requests = []
    if gpus:
        device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
    return {
        "image": image_id,
        "entrypoint": ["python3", *READINESS_ARGS],
        "user": user,
        "environment": env,
        "working_dir": "/tmp",
        "init": True,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "device_requests": device_requests,
        "stdin_open": False,
        "tty": False,
    }


def job_user(image_user: str) -> str:
    """The user a job container of an image with this configured user runs as: never root."""
    from worker.node.executors.docker import NOBODY

    if image_user in ("", "0", "root") or image_user.startswith(("0:", "root:")):
        return "{}:{}".format(*NOBODY)
    return image_user


def in_container(
    client: Any,
    image_id: str,
    *,
    gpus: bool,
    user: str,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the checks in a fresh container of the image; the container is removed, by this
    call or (`labels`: its agent's, for a killed agent) by the agent's next start."""
    options = container_options(image_id, gpus=gpus, user=user)
    container = client.containers.create(**options, labels=labels or {})
    try:
        container.start()
        container.wait(timeout=PROBE_TIMEOUT_SECONDS)
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", errors="replace")
    finally:
        container.remove(force=True)
    return parse_report(stdout)


def host_gpus_usable(client: Any) -> bool:
    """Whether containers here can be given GPUs: the driver lists some and Docker has the
    NVIDIA runtime (without it, a GPU request fails the container at start)."""
    from worker.record.gpu_info import gpu_devices

    return bool(gpu_devices()) and "nvidia" in (client.info().get("Runtimes") or {})


def in_image(reference: str) -> dict[str, Any]:
    """Run the checks in a container of a local image, as a job of it would run."""
    import docker

    client = docker.from_env()
    try:
        image = client.images.get(reference)
        user = job_user(str((image.attrs.get("Config") or {}).get("User") or ""))
        return in_container(client, str(image.id), gpus=host_gpus_usable(client), user=user)
    finally:
        client.close()


def agent_flags(executor: Any) -> list[dict[str, str]] | None:
    """What the checks flag where this executor runs jobs; None if they could not run."""
    try:
        if executor.kind == "docker":
            image = executor.image_for(None)
            report = in_container(
                executor.client,
                image.id,
                gpus=bool(executor.gpus),
                user=job_user(image.user),
                labels=executor.agent_labels(),
            )
        else:
            report = in_process()
    except Exception as exc:  # the worker still works; its page says it was not checked
        log.warning("the reproducibility checks did not run (%s: %s)", type(exc).__name__, exc)
        return None
    flags = registration_flags(report)
    for flag in flags:
        log.warning("reproducibility: %s: %s", flag["check"], flag["message"])
    return flags
