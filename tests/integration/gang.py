"""A multi-host run's job processes on this machine, each given the cluster in
`TF_CONFIG` as a gang's members are."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.jobs import Finished, job_env, parse_line, read_result, write_spec


def free_addresses(count: int) -> list[str]:
    """Free ports on 127.0.0.1, released for the members to bind (TensorFlow takes none
    of its own choosing)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


class Gang:
    """`hosts` job processes of one run, member r in `root`/m<r> with its own checkpoints
    (and `envs[r]` added to its environment)."""

    def __init__(
        self,
        spec: dict[str, Any],
        root: Path,
        *args: str,
        envs: list[dict[str, str]] | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        spec_path = write_spec(spec, root)
        hosts = spec["distribution"]["hosts"]
        addresses = free_addresses(hosts)
        self.dirs = [root / f"m{r}" for r in range(hosts)]
        self.procs = []
        self.logs = []
        for rank, d in enumerate(self.dirs):
            d.mkdir(exist_ok=True)
            cluster = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}
            argv = ["--spec", str(spec_path), "--out", str(d / "result.json")]
            argv += ["--checkpoint-dir", str(d / "ckpt"), *args]
            self.logs.append(open(d / "stderr.log", "w"))  # noqa: SIM115 (closed in member)
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "worker.run", *argv],
                    env={
                        **job_env(),
                        **(envs[rank] if envs else {}),
                        "TF_CONFIG": json.dumps(cluster),
                    },
                    stdout=subprocess.DEVNULL,
                    stderr=self.logs[-1],
                )
            )

    def member(self, rank: int, timeout: float = 300) -> Finished:
        """Member `rank` once it has ended."""
        proc = self.procs[rank]
        proc.wait(timeout=timeout)
        self.logs[rank].close()
        err = (self.dirs[rank] / "stderr.log").read_text()
        events = [e for e in map(parse_line, err.splitlines()) if e is not None]
        result = read_result(self.dirs[rank] / "result.json")
        return Finished(proc.returncode, result, events, err)

    def wait(self, timeout: float = 300) -> list[Finished]:
        return [self.member(r, timeout) for r in range(len(self.procs))]
