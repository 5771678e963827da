"""A job runs code the worker does not vouch for: it never sees the worker's credentials."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.jobs import blobs_spec, job_env, job_request
from worker.node.executors.docker import container_environment
from worker.node.executors.process import ProcessExecutor
from worker.result import read_result

DUMP_VARIABLE = "REPRO_TEST_ENV_DUMP"

# An architecture that, while the job builds its model, writes what the job process can see
# of its environment: os.environ, /proc/self/environ, and the environment its agent (the
# parent) was started with, /proc/<agent>/environ, which the job's user may otherwise read.
_PLUGIN = textwrap.dedent(
    """
    import json
    import os
    from typing import Any


    def environ_mlp(params: dict[str, Any], data: Any) -> Any:
        import keras

        with open("/proc/self/environ", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
        try:
            with open(f"/proc/{os.getppid()}/environ", "rb") as f:
                parent = f.read().decode("utf-8", "replace")
        except OSError as exc:
            parent = f"unreadable: {exc}"
        with open(os.environ["REPRO_TEST_ENV_DUMP"], "w") as f:
            json.dump({"environ": dict(os.environ), "proc": raw, "parent": parent}, f)
        inputs = keras.Input(shape=data.x_shape, name="inputs")
        return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(inputs))
    """
)

SECRETS = {
    "REPRO_TOKEN": "rpt_1_agent-worker-token-value",
    "REPRO_DATABASE_URL": "postgresql+psycopg://repro:db-password-value@db:5432/repro",
    "REPRO_DASHBOARD_SECRET": "dashboard-secret-value",
    "REPRO_PROVENANCE_KEY": "agents-own-provenance-key",
    "AWS_SECRET_ACCESS_KEY": "cloud-secret-value",
    "GITHUB_TOKEN": "ghp_forge-token-value",
    "PGPASSWORD": "pg-password-value",
    "HTTPS_PROXY": "http://proxyuser:proxy-password-value@proxy:3128",
}


@pytest.fixture
def environ_plugin(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    info = site / "repro_environ_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: repro-environ-plugin\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[reprotrain.architectures]\nenviron_mlp = repro_environ_plugin:environ_mlp\n"
    )
    (site / "repro_environ_plugin.py").write_text(_PLUGIN)
    return site


def test_a_process_job_sees_no_credential_of_its_worker(
    tmp_path: Path, environ_plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent's environment, as an operator might start it: its token and more.
    for name, value in {**job_env([environ_plugin]), **SECRETS}.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "environ.json"
    monkeypatch.setenv(DUMP_VARIABLE, str(dump))
    monkeypatch.setenv("REPRO_TEST_ORDINARY", "kept")
    spec = blobs_spec(model={"architecture": "environ_mlp", "params": {}})
    spec["training"]["epochs"] = 1
    request = job_request(
        tmp_path / "attempt",
        spec,
        "1",
        None,
        environment={"REPRO_PROVENANCE_KEY": "the-claims-provenance-key"},
    )

    job = ProcessExecutor().start(request)
    try:
        stderr = "\n".join(job.stderr_lines())
        code = job.wait()
    finally:
        job.close()

    assert code == 0, stderr
    assert read_result(request.result_path).error is None
    seen = json.loads(dump.read_text())
    everything = json.dumps(seen)
    for name, value in SECRETS.items():
        assert value not in everything, f"the job saw {name}"
    for name in ("REPRO_TOKEN", "REPRO_DATABASE_URL", "REPRO_DASHBOARD_SECRET", "GITHUB_TOKEN"):
        assert name not in seen["environ"]
    # What the job needs is still there: the claim's key, the path to its plugins, the rest.
    assert seen["environ"]["REPRO_PROVENANCE_KEY"] == "the-claims-provenance-key"
    assert str(environ_plugin) in seen["environ"]["PYTHONPATH"]
    assert seen["environ"]["REPRO_TEST_ORDINARY"] == "kept"


# An agent process as an operator starts one: the token in the environment it starts with.
_AGENT = """
import sys
from pathlib import Path
from tests.integration.jobs import blobs_spec, job_request
from worker.node.executors.process import ProcessExecutor
spec = blobs_spec(model={"architecture": "environ_mlp", "params": {}})
spec["training"]["epochs"] = 1
request = job_request(Path(sys.argv[1]), spec, "1", None)
job = ProcessExecutor().start(request)
try:
    sys.stderr.write("\\n".join(job.stderr_lines()))
    sys.exit(job.wait())
finally:
    job.close()
"""


def test_a_process_job_cannot_read_its_agents_environment_either(
    tmp_path: Path, environ_plugin: Path
) -> None:
    # The agent is started with its token in its environment, as an operator starts it; the
    # job runs as the same user, so /proc/<agent>/environ is the job's to read.
    dump = tmp_path / "environ.json"
    env = {**job_env([environ_plugin]), **SECRETS, DUMP_VARIABLE: str(dump)}
    agent = subprocess.run(
        [sys.executable, "-c", _AGENT, str(tmp_path / "attempt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert agent.returncode == 0, agent.stderr[-3000:]
    seen = json.loads(dump.read_text())
    everything = json.dumps(seen)
    for name, value in SECRETS.items():
        assert value not in everything, f"the job saw {name}"
    # It did read the agent's environment (root, or a kernel that allows it) or was refused.
    parent = seen["parent"]
    assert f"{DUMP_VARIABLE}={dump}" in parent or parent.startswith("unreadable"), parent


def test_a_container_job_is_given_no_credential_of_its_worker() -> None:
    agent = {**SECRETS, "TF_AUTH_TOKEN": "tf-named-secret", "OMP_NUM_THREADS": "2"}
    env = container_environment(agent)
    assert env["OMP_NUM_THREADS"] == "2"
    for value in [*SECRETS.values(), "tf-named-secret"]:
        assert value not in env.values()
