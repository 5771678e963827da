"""An idle worker's part in multi-host runs: join a gang, wait for it to complete, and
take the run's claim with this member's rank and the others' addresses."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from worker.node.client import ApiClient, Id

log = logging.getLogger(__name__)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def gang_claim(
    client: ApiClient,
    worker_id: Id,
    *,
    host: str,
    stop: threading.Event,
    poll_interval: float,
    waiting: Callable[[], None] = lambda: None,
) -> dict[str, Any] | None:
    """The claim of a multi-host run this worker is now a member of the gang of (its
    `gang`: {"rank", "cluster"}), or None when there is no gang for it now.

    A port on `host` is held while the gang forms, and let go just before the claim is
    returned, for the job's collectives to listen on (TensorFlow takes no port of its own
    choosing). `waiting()` runs between tries (the agent's liveness)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as reserved:
        reserved.bind((host, 0))
        address = _address(host, reserved.getsockname()[1])
        state = client.join_gang(worker_id, address)
        if state.get("state") == "forming":
            log.info(
                "in the gang of run %s (%s of %s joined); waiting for the rest",
                state.get("run_id"),
                state.get("joined"),
                state.get("hosts"),
            )
        while state.get("state") == "forming" and not stop.is_set():
            waiting()
            stop.wait(poll_interval)
            state = client.join_gang(worker_id, address)
    if state.get("state") != "formed" or not state.get("claim"):
        if state.get("run_id") is not None and state.get("state") == "none":
            log.info("the gang of run %s was let go", state.get("run_id"))
        return None
    claim = dict(state["claim"])
    claim["gang"] = {"rank": int(state["rank"]), "cluster": list(state["cluster"])}
    log.info(
        "run %s: gang of %d formed; this worker is rank %d at %s",
        claim["run"]["id"],
        len(claim["gang"]["cluster"]),
        claim["gang"]["rank"],
        address,
    )
    return claim
