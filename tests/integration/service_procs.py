"""A real API server and real worker agents as separate processes, for end-to-end tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.cli_runner import repro_command
from tests.integration.asgi_browser import hidden_value
from tests.integration.jobs import job_env
from tests.ports import free_port


class Service:
    """`repro serve` in its own process, with its own data directory and port.

    Once ready, `client` carries the admin token the server created on first start.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        port: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()  # a restarted server takes its predecessor's port
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token = ""
        args = ["serve", "--port", str(self.port), "--data-dir", str(data_dir), *extra]
        if database_url:
            args += ["--database-url", database_url]
        self.log = data_dir.parent / f"serve-{self.port}.log"
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            repro_command(*args),
            env={**job_env(), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.client = httpx.Client(base_url=self.url, timeout=30)
        self._clients: list[httpx.Client] = []
        self._worker_tokens: dict[str, str] = {}

    def wait_ready(self, timeout: float = 60) -> Service:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                # The token file is written before the server listens: without it, whatever
                # answered is not this server (which will then exit, unable to bind).
                token_file = self.data_dir / "admin-token"
                if self.client.get("/readyz").status_code == 200 and token_file.exists():
                    self.admin_token = token_file.read_text().strip()
                    self.client.headers["Authorization"] = f"Bearer {self.admin_token}"
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready: {self.log.read_text()[-3000:]}")

    def dashboard(self) -> httpx.Client:
        """An HTTP client logged in to the dashboard with the admin token, keeping its cookie
        as a browser does (closed in stop)."""
        browser = httpx.Client(base_url=self.url, timeout=60)
        self._clients.append(browser)
        form_token = hidden_value(browser.get("/login").text, "form_token")
        login = browser.post("/login", data={"token": self.admin_token, "form_token": form_token})
        assert login.status_code == 303, login.text
        return browser

    def token(self, role: str, name: str = "test") -> str:
        """A new token of `role`, created with the admin token."""
        created = self.client.post("/api/v1/tokens", json={"name": name, "role": role})
        assert created.status_code == 201, created.text
        return str(created.json()["token"])

    def client_for(self, role: str, name: str = "test") -> httpx.Client:
        """An HTTP client authenticated with a new token of `role`."""
        headers = {"Authorization": f"Bearer {self.token(role, name)}"}
        client = httpx.Client(base_url=self.url, timeout=30, headers=headers)
        self._clients.append(client)  # closed in stop()
        return client

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for client in [self.client, *self._clients]:
            client.close()
        self._log.close()

    def submit(
        self, spec: str, content_type: str = "application/yaml", **headers: str
    ) -> httpx.Response:
        return self.client.post(
            "/api/v1/experiments", content=spec, headers={"content-type": content_type, **headers}
        )

    def wait_run(
        self,
        run_id: int,
        timeout: float = 240,
        until: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run: dict[str, Any] = self.client.get(f"/api/v1/runs/{run_id}").json()
            if run["status"] in until:
                return run
            time.sleep(0.25)
        raise TimeoutError(f"run {run_id} still {run['status']}: {self.log.read_text()[-3000:]}")

    def worker(
        self, work_dir: Path, env: dict[str, str] | None = None, *, readiness_checks: bool = False
    ) -> WorkerProc:
        """A worker agent process with its own worker token, named after its directory.

        A worker started again under a name keeps its token, and so its identity.
        """
        name = work_dir.name
        if name not in self._worker_tokens:
            self._worker_tokens[name] = self.token("worker", name)
        token = self._worker_tokens[name]
        return WorkerProc(
            self.url, work_dir, token=token, name=name, env=env, readiness_checks=readiness_checks
        )


class WorkerProc:
    """`repro worker` in its own process; `extra` goes after the usual options (an executor).

    Its readiness checks and warm interpreters are off unless a test asks for them: each
    imports TensorFlow (about 7 s of CPU here), the checks in every agent and the warm
    interpreter once more than the agent's jobs need, and the suite runs on two cores. Their
    own tests (test_worker_readiness, test_doctor, test_warm_start) turn them on, and so does
    `repro serve --with-worker` (the README's and the dashboard's tests), which starts the
    default agent.
    """

    def __init__(
        self,
        api: str,
        work_dir: Path,
        *,
        token: str,
        name: str = "w",
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        readiness_checks: bool = False,
        warm_start: bool = False,
    ) -> None:
        self.token = token  # to start the same worker again
        work_dir.mkdir(parents=True, exist_ok=True)
        self.log = work_dir / "agent.log"
        self._log = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        token_file = work_dir / "worker-token"  # never on the command line: it is public
        token_file.write_text(token)
        token_file.chmod(0o600)
        self.proc = subprocess.Popen(
            repro_command(
                "worker",
                "--api",
                api,
                "--token-file",
                str(token_file),
                "--name",
                name,
                "--work-dir",
                str(work_dir),
                "--poll",
                "0.2",
                "--readiness-checks" if readiness_checks else "--no-readiness-checks",
                "--warm-start" if warm_start else "--no-warm-start",
                *extra,
            ),
            env={**job_env(), **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def worker_id(self, timeout: float = 60) -> int:
        """The id the API gave this agent, once it has registered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"registered as worker (\d+)", self.log.read_text())
            if found:
                return int(found.group(1))
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise TimeoutError(self.log.read_text())

    def signal(self, sig: int, timeout: float = 90) -> None:
        """Sends `sig` and waits for the exit: a SIGTERM mid-job first checkpoints and releases."""
        self.proc.send_signal(sig)
        self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextmanager
def running(service: Service, *workers_dirs: Path) -> Iterator[tuple[Service, list[WorkerProc]]]:
    """A ready service and one worker per directory, all stopped afterwards."""
    workers: list[WorkerProc] = []
    try:
        service.wait_ready()
        workers = [service.worker(d) for d in workers_dirs]
        yield service, workers
    finally:
        for w in workers:
            w.stop()
        service.stop()


@contextmanager
def service_with_worker(
    root: Path, *worker_options: str, name: str, env: dict[str, str] | None = None
) -> Iterator[Service]:
    """A ready service (no demo) in `root`/data and one worker agent named `name` in
    `root`/agent, started with `worker_options` (an executor, `--trust-code`) and registered
    before the service is handed over; both stopped after."""
    svc = Service(root / "data", env=env, extra=("--no-demo",))
    try:
        svc.wait_ready()
        token = svc.token("worker", name)
        agent = WorkerProc(svc.url, root / "agent", token=token, name=name, extra=worker_options)
        try:
            agent.worker_id()
            yield svc
        finally:
            agent.stop()
    finally:
        svc.stop()


def trusting_service(root: Path) -> AbstractContextManager[Service]:
    """A ready service under `root` and one worker that accepts code bundles."""
    return service_with_worker(root, "--trust-code", name=f"trusted-{root.name}")
