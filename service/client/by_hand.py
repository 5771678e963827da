"""A script run by hand, recorded on the service: what `reprotrain.init()` attaches to when
the environment names a service (`REPRO_API_URL`, and `REPRO_TOKEN`).

`init()` (the in-script runtime, `worker.script`) asks `connect` for a link when it starts:
the script's directory goes to the code store by digest and the experiment and its run are
recorded there, running; `report` sends the run's result document when it ends. Without
`REPRO_API_URL` there is no link, and the run is recorded on disk only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .client import Client


class ServerLink:
    """The run on the server that a script run by hand reports to."""

    def __init__(
        self,
        client: Client,
        run_id: int,
        spec: dict[str, Any],
        spec_hash: str,
        code: dict[str, Any],
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.url = f"{client.url.rstrip('/')}/runs/{run_id}"
        self.spec = spec  # the experiment's spec, its seed resolved
        self.spec_hash = spec_hash
        self.code = code  # the script directory's bundle: digest, name, files

    def report(self, result: Mapping[str, Any]) -> None:
        self.client.report_result(self.run_id, result)


def connect(
    script: str, args: Sequence[str], *, name: str, seed: Sequence[int]
) -> ServerLink | None:
    """Record the run on the service the environment names; None when it names none."""
    if not os.environ.get("REPRO_API_URL"):
        return None
    client = Client()
    run, bundle = client.record_script_run(script, args, name=name, seed=seed)
    code = {
        "digest": bundle.digest,
        "name": bundle.name,
        "files": {f.path: f.sha256 for f in bundle.files},
    }
    return ServerLink(client, run.id, dict(run.spec or {}), str(run.spec_hash), code)
