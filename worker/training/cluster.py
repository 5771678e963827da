"""Which host of a multi-host run this process is, from the `TF_CONFIG` its gang gave it.

`TF_CONFIG` is TensorFlow's own cluster description, which MultiWorkerMirroredStrategy
reads: `{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}`.
Every member of a gang gets the same worker list, in rank order, and its own index.
TensorFlow-free, so a job can check it before TensorFlow starts.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from worker.errors import ReproError

ENV = "TF_CONFIG"


class ClusterError(ReproError):
    """The process's cluster description does not fit the run's hosts."""


@dataclass(frozen=True)
class Host:
    """This process's place in a run's cluster."""

    hosts: int
    rank: int
    addresses: tuple[str, ...] = ()


def this_host(hosts: int, environ: Mapping[str, str] | None = None) -> Host:
    """This process's place among a run's `hosts`; the only one of one host whatever
    `TF_CONFIG` says. Raises ClusterError when a multi-host run's description is missing or
    does not describe `hosts` workers."""
    if hosts == 1:
        return Host(1, 0)
    raw = (os.environ if environ is None else environ).get(ENV)
    if not raw:
        raise ClusterError(
            f"distribution.hosts is {hosts} but {ENV} is not set: a multi-host run's "
            "members are started by the service, which describes the cluster to each"
        )
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        kind, index = task["type"], task["index"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(
            f"{ENV} must be {{'cluster': {{'worker': [...]}}, 'task': {{'type': 'worker', "
            f"'index': i}}}}: {exc!r}"
        ) from None
    others = sorted(set(config["cluster"]) - {"worker"})
    if others:
        raise ClusterError(f"{ENV} may name only workers, not {', '.join(others)}")
    if not isinstance(workers, list) or not all(isinstance(w, str) and w for w in workers):
        raise ClusterError(f"{ENV}: cluster.worker must be a list of host:port addresses")
    if len(workers) != hosts:
        raise ClusterError(
            f"distribution.hosts is {hosts} but {ENV} describes {len(workers)} worker(s)"
        )
    if kind != "worker" or not isinstance(index, int) or not 0 <= index < hosts:
        raise ClusterError(f"{ENV}: task must be a worker with an index below {hosts}")
    return Host(hosts, index, tuple(workers))


def gang_environment(gang: Mapping[str, object] | None) -> dict[str, str]:
    """The `TF_CONFIG` of a gang member's job (`{"rank", "cluster"}` from its claim)."""
    if not gang:
        return {}
    config = {
        "cluster": {"worker": list(gang["cluster"])},  # type: ignore[call-overload]
        "task": {"type": "worker", "index": gang["rank"]},
    }
    return {ENV: json.dumps(config)}


def own_shards(shards: int, host: Host) -> tuple[int, int] | None:
    """The [first, end) dataset shards of each batch that `host` generates; None for all."""
    if host.hosts == 1:
        return None
    per_host = shards // host.hosts
    return (per_host * host.rank, per_host * (host.rank + 1))


DEFAULT_JOIN_SECONDS = 300.0


def lost_member(message: str) -> str:
    """What a host says when a collective failed because another member went away, from
    TensorFlow's message (which runs to a page of where the op was defined)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    cause = next((ln for ln in lines if "aborted by" in ln or "heartbeat" in ln.lower()), None)
    peer = re.search(r"/job:worker/replica:\d+/task:(\d+)", message)
    said = cause or (lines[-1] if lines else "no message")
    whom = f" (from host {peer.group(1)})" if peer else ""
    return (
        f"the cluster lost a member: a collective across hosts failed: {said}{whom}; every "
        "member stops, and the run resumes from rank 0's last checkpoint on a new cluster"
    )


class JoinDeadline:
    """Ends a host's wait for the rest of its cluster after `seconds`.

    MultiWorkerMirroredStrategy waits for every member without a bound, inside TensorFlow,
    holding the interpreter: no Python timer or signal handler runs meanwhile. So the
    job's failed result is written before the wait (`provisional`, removed once joined) and
    the interpreter's fault handler, whose timer thread is native code, ends the process
    with exit code 1 when the time is up.
    """

    def __init__(self, seconds: float, host: Host, provisional: Callable[[str], Path]) -> None:
        self.seconds, self.host, self._provisional = seconds, host, provisional
        self._written: Path | None = None

    def start(self) -> None:
        if self.host.hosts == 1:
            return
        others = [a for i, a in enumerate(self.host.addresses) if i != self.host.rank]
        self._written = self._provisional(
            f"the cluster of {self.host.hosts} hosts did not form within {self.seconds:g} s: "
            f"host {self.host.rank} waited for {', '.join(others)}; every member must start "
            "and reach the others' addresses"
        )
        faulthandler.dump_traceback_later(self.seconds, exit=True)

    def joined(self) -> None:
        if self._written is None:
            return
        faulthandler.cancel_dump_traceback_later()
        self._written.unlink(missing_ok=True)
        self._written = None
