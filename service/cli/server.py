"""Commands that run things: the API (optionally with a local worker), a worker, migrations."""

from __future__ import annotations

import enum
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from service.cli.output import (
    DEFAULT_API,
    ApiOption,
    Command,
    Group,
    TokenFileOption,
    err,
    resolve_token,
)

if TYPE_CHECKING:  # imported where used: `repro --help` should not wait for them
    import uvicorn
    from fastapi import FastAPI

    from service.config import Settings
    from worker.node.agent import Agent

DataDirOption = Annotated[
    Path | None, typer.Option(help="data directory (database, artifacts) [REPRO_DATA_DIR]")
]
DatabaseOption = Annotated[
    str | None, typer.Option(help="database URL; default: SQLite in the data directory")
]


class WorkerExecutor(enum.StrEnum):
    """How a worker runs each job."""

    process = "process"
    docker = "docker"


WorkerNameOption = Annotated[str | None, typer.Option(help="worker name shown in the API")]
WorkDirOption = Annotated[
    Path | None,
    typer.Option(
        help="where jobs write their files and results wait until the API takes them; "
        "keep it across restarts [default: $XDG_STATE_HOME/reprotrain/worker]"
    ),
]
MaxJobsOption = Annotated[int | None, typer.Option(help="exit after this many jobs")]
PollOption = Annotated[
    float, typer.Option(help="seconds between claims when the API answers them at once")
]
ClaimWaitOption = Annotated[
    float,
    typer.Option(
        min=0,
        max=30,
        help="seconds each claim waits on the API for a run (long poll; 0: poll instead)",
    ),
]
ExecutorOption = Annotated[
    WorkerExecutor,
    typer.Option(help="how each job runs: a fresh process here, or a fresh container"),
]
ImageOption = Annotated[
    list[str] | None,
    typer.Option(help="an image this worker runs (repeatable); runs pinning it come here"),
]
MemoryOption = Annotated[
    str | None, typer.Option(help="docker: memory limit of each job container (e.g. 8g)")
]
CpusOption = Annotated[
    float | None, typer.Option(min=0.01, help="docker: CPUs each job container may use")
]
PidsOption = Annotated[
    int, typer.Option(min=16, help="docker: most processes and threads in a job container")
]
DeadlineOption = Annotated[
    float | None,
    typer.Option(min=1, help="docker: seconds a job may run before it is stopped and fails"),
]
AllowTagOption = Annotated[
    bool,
    typer.Option(help="docker: also run runs that pin an image by tag, without a digest"),
]
GangAddressOption = Annotated[
    str | None,
    typer.Option(
        "--gang-address",
        envvar="REPRO_WORKER_GANG_ADDRESS",
        help="join multi-host runs (distribution.hosts > 1): the address of this node that "
        "the other members' jobs reach it at (an IP or name, no port: each run gets a free "
        "port); process executor only (containers run without a network)",
    ),
]
CpuReplicasOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=1024,
        envvar="REPRO_WORKER_CPU_REPLICAS",
        help="on a node without GPUs: logical CPU devices a job may split the CPU into, so "
        "runs asking for up to this many replicas come here (advertised to the API as "
        "cpu_devices; default: one per CPU core); a node with GPUs offers its GPUs instead",
    ),
]


def _configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat is noise


def _settings(data_dir: Path | None, database_url: str | None, **more: Any) -> Settings:
    from service.config import Settings

    overrides: dict[str, Any] = {k: v for k, v in more.items() if v is not None}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if database_url is not None:
        overrides["database_url"] = database_url
    return Settings(**overrides)


def _is_first_start(settings: Settings) -> bool:
    from sqlalchemy import func, select

    from service.persistence.engine import make_engine
    from service.persistence.models import Experiment

    engine = make_engine(settings.resolved_database_url)
    try:
        with engine.connect() as conn:
            return (conn.scalar(select(func.count(Experiment.id))) or 0) == 0
    finally:
        engine.dispose()


def _demo(api: str, token: str, spec: Path) -> None:
    """Submit the example, rerun it, and print the verdict (first start only)."""
    from reprotrain import Client
    from worker.compare.verdict import describe

    with Client(api, token) as client:
        first = client.submit(spec, idempotency_key="first-start-demo")
        err.print(f"[bold]demo:[/bold] submitted {spec.name} as run {first.id}; training…")
        first = first.wait()
        if first.status != "succeeded":
            err.print(f"[red]demo run {first.id} {first.status}[/red]: {first.error}")
            return
        rerun = first.rerun()
        err.print(f"[bold]demo:[/bold] run {first.id} succeeded; rerun queued as run {rerun.id}")
        done = rerun.wait()
    report = done.raw.get("verdict_report")
    line = describe(report) if report else f"no verdict ({done.status})"
    typer.echo(f"demo: run {rerun.id} rerun of run {first.id}: verdict {line}", err=False)
    # The dashboard's page of the pair (a person's browser; the API's JSON would answer 401).
    err.print(
        f"[bold]demo:[/bold] see {api}/compare?a={first.id}&b={rerun.id} in the dashboard "
        "(log in with the link above, or with the admin token)  (Ctrl-C to stop)",
        soft_wrap=True,
        highlight=False,
    )


def _bootstrap_tokens(settings: Settings, *, with_worker: bool) -> tuple[str | None, str | None]:
    """The local admin token (created on a fresh database) and the local worker's token."""
    from service.auth.bootstrap import ADMIN_TOKEN_FILE, WORKER_TOKEN_FILE, ensure_token
    from service.errors import Unauthorized
    from service.persistence.engine import make_engine, make_sessionmaker

    engine = make_engine(settings.resolved_database_url)
    try:
        with make_sessionmaker(engine)() as db:
            admin: str | None = None
            try:
                admin, created = ensure_token(
                    db, settings.data_dir, ADMIN_TOKEN_FILE, role="admin", name="local admin"
                )
                where = settings.data_dir / ADMIN_TOKEN_FILE
                err.print(
                    f"admin token {'created and ' if created else ''}kept in {where} "
                    "(owner-only); send it as 'Authorization: Bearer <token>'"
                )
            except Unauthorized as exc:
                err.print(f"[yellow]no local admin token:[/yellow] {exc}")
            worker = None
            if with_worker:
                worker, _ = ensure_token(
                    db, settings.data_dir, WORKER_TOKEN_FILE, role="worker", name="local worker"
                )
            return admin, worker
    finally:
        engine.dispose()


def _prepare_database(*, settings: Settings, migrate: bool) -> bool:
    """Whether this is the first start, once the data directory and database are ready; exit 2
    if the database was left to be migrated by someone else and is not at the head."""
    from service.persistence.file_modes import private_dir
    from service.persistence.migrate import schema_behind, upgrade

    private_dir(settings.data_dir)  # database, artifacts and tokens: owner-only
    if migrate:
        upgrade(settings.resolved_database_url)
    elif (behind := schema_behind(settings.resolved_database_url)) is not None:
        err.print(f"[red]not migrated:[/red] {behind}; run `repro db upgrade` first")
        raise typer.Exit(2)
    return _is_first_start(settings)


def _start_api(
    *, app: FastAPI, settings: Settings, host: str, port: int
) -> tuple[uvicorn.Server, threading.Thread]:
    """The API server, started on its own thread, and that thread; exit 1 if it fails to start."""
    import uvicorn

    from service.api.header_deadline import header_deadline_protocol

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        # Slow clients: headers within header_timeout_seconds (the body's deadline is the
        # app's; a body still arriving when its answer is complete is never read on: the
        # connection closes), request line and headers at most 16 KiB (400 past it).
        http=header_deadline_protocol(settings.header_timeout_seconds),
        h11_max_incomplete_event_size=16 * 1024,
    )
    server = uvicorn.Server(config)
    server_thread = threading.Thread(target=server.run, name="api", daemon=True)
    server_thread.start()
    while not server.started:
        if not server_thread.is_alive():
            raise typer.Exit(1)
        time.sleep(0.05)
    return server, server_thread


def _announce(
    *, app: FastAPI, api: str, settings: Settings, admin_token: str | None, login_link: bool
) -> None:
    """Tell the operator where the API is and how to log in."""
    from service.auth.bootstrap import ADMIN_TOKEN_FILE

    err.print(f"Reprotrain API on {api}  (docs: {api}/docs, data: {settings.data_dir})")
    if admin_token:
        where = settings.data_dir / ADMIN_TOKEN_FILE  # never print any of the secret itself
        err.print(f"log in at {api}/docs (Authorize) with the admin token in {where}")
        if not login_link:
            err.print("dashboard: no login link (not a terminal; --print-login-link prints one)")
            return
        from service.dashboard import issue_login_url

        # One use, 15 minutes: the link stands for the admin token without showing it.
        link = issue_login_url(app, api, admin_token)
        err.print(f"dashboard: {link}  (one-time login link)", soft_wrap=True, highlight=False)


def _start_local_worker(
    *, api: str, token: str | None, settings: Settings
) -> tuple[Agent, threading.Thread]:
    """The in-process worker agent, started on its own thread, and that thread."""
    from worker.node.agent import Agent
    from worker.node.client import ApiClient

    agent = Agent(ApiClient(api, token), name="local", work_dir=settings.data_dir / "worker")
    agent_thread = threading.Thread(target=agent.run, name="worker", daemon=True)
    agent_thread.start()
    return agent, agent_thread


def _wait_for_signal(*, server_thread: threading.Thread) -> None:
    """Wait for SIGINT or SIGTERM, or for the API server to stop."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set() and server_thread.is_alive():
        stop.wait(0.5)


def _stop(
    *,
    app: FastAPI,
    server: uvicorn.Server,
    server_thread: threading.Thread,
    local_worker: tuple[Agent, threading.Thread] | None,
) -> None:
    """Stop the local worker first, then the API."""
    err.print("stopping…")
    if local_worker is not None:
        agent, agent_thread = local_worker
        agent.request_stop()  # the job checkpoints and is released while the API is still up
        agent_thread.join(timeout=120)
    app.state.queue_bell.close()  # waiting claims answer now rather than hold up the shutdown
    server.should_exit = True
    server_thread.join(timeout=30)


def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    data_dir: DataDirOption = None,
    database_url: DatabaseOption = None,
    with_worker: Annotated[bool, typer.Option(help="also run a worker in this process")] = False,
    demo: Annotated[
        bool, typer.Option(help="on first start, submit the example and its rerun")
    ] = True,
    migrate: Annotated[
        bool,
        typer.Option(
            help="migrate the database first (one migrator at a time); --no-migrate: leave "
            "it to `repro db upgrade` and refuse to start on a database not at the head"
        ),
    ] = True,
    print_login_link: Annotated[
        bool | None,
        typer.Option(
            "--print-login-link/--no-print-login-link",
            help="print a one-time admin login link for the dashboard (default: only when "
            "stderr is a terminal, so never into a log collector)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the API (migrating the database first); Ctrl-C stops it gracefully."""
    from service.app import create_app
    from service.cli.local import EXAMPLES
    from worker.models import registry

    _configure_logging()
    registry.import_no_plugins()  # the API never imports TensorFlow, which plugins do
    settings = _settings(data_dir, database_url, host=host, port=port)
    first_start = _prepare_database(settings=settings, migrate=migrate)
    admin_token, worker_token = _bootstrap_tokens(settings, with_worker=with_worker)
    app = create_app(settings)
    server, server_thread = _start_api(app=app, settings=settings, host=host, port=port)
    api = f"http://{host}:{port}"
    # The link logs in as admin: a log collector (pod or compose logs) must never get one.
    login_link = sys.stderr.isatty() if print_login_link is None else print_login_link
    _announce(app=app, api=api, settings=settings, admin_token=admin_token, login_link=login_link)
    local_worker = None
    if with_worker:
        local_worker = _start_local_worker(api=api, token=worker_token, settings=settings)
    example = EXAMPLES / "seed001.yaml"
    if demo and first_start and with_worker and admin_token and example.exists():
        threading.Thread(
            target=_demo, args=(api, admin_token, example), name="demo", daemon=True
        ).start()
    _wait_for_signal(server_thread=server_thread)
    _stop(app=app, server=server, server_thread=server_thread, local_worker=local_worker)


def _executor_setup(
    *,
    executor: WorkerExecutor,
    image: list[str] | None,
    memory: str | None,
    cpus: float | None,
    pids: int,
    deadline: float | None,
    allow_tag: bool,
) -> tuple[dict[str, Any], list[str]]:
    """The executor's options and the images the worker advertises; exit 2 on a misfit option."""
    if executor is WorkerExecutor.docker:
        # The executor resolves each --image to its image ID and advertises that.
        options = {
            "images": image or [],
            "memory": memory,
            "cpus": cpus,
            "pids": pids,
            "deadline": deadline,
            "allow_tag": allow_tag,
        }
        return options, []
    if memory or cpus or deadline or allow_tag:
        err.print("[red]--memory, --cpus, --deadline and --allow-tag need --executor docker[/red]")
        raise typer.Exit(2)
    return {}, image or []


def _worker_token(ctx: typer.Context, token: str | None, token_file: Path | None) -> str | None:
    """The agent's token from --token-file or REPRO_TOKEN; exits 2 for one on the command line,
    where every local user and every job on the machine could read it for the agent's life."""
    from typer._click.core import ParameterSource

    if token and ctx.get_parameter_source("token") is ParameterSource.COMMANDLINE:
        err.print(
            "[red]refused:[/red] a worker's token on the command line stays readable in the "
            "process list for the agent's whole life; put it in an owner-only file and pass "
            "--token-file FILE (or set REPRO_TOKEN_FILE or REPRO_TOKEN)",
            highlight=False,
        )
        raise typer.Exit(2)
    return resolve_token(token, token_file) if token_file else token


WorkerTokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="REPRO_TOKEN",
        help="refused on the command line (it would be public): use --token-file",
    ),
]
TrustCodeOption = Annotated[
    bool,
    typer.Option(
        "--trust-code",
        help="process: also run code bundles, as this agent's user (docker always does)",
    ),
]
ReadinessChecksOption = Annotated[
    bool,
    typer.Option(
        "--readiness-checks/--no-readiness-checks",
        help="run `repro doctor`'s checks where jobs run and report their flags",
    ),
]
EnrollOption = Annotated[
    bool,
    typer.Option(
        "--enroll",
        help="the token is the fleet's bootstrap token: enroll this worker once, keep its "
        "own credential in the work directory (owner-only) and use that from then on",
    ),
]
WarmStartOption = Annotated[
    bool,
    typer.Option(
        "--warm-start/--no-warm-start",
        help="process: while idle, start the next job's interpreter (TensorFlow imported) "
        "so a claimed job starts training sooner (docker, and --trust-code, always start "
        "cold)",
    ),
]


def worker(
    ctx: typer.Context,
    api: ApiOption = DEFAULT_API,
    token: WorkerTokenOption = None,
    token_file: TokenFileOption = None,
    name: WorkerNameOption = None,
    work_dir: WorkDirOption = None,
    max_jobs: MaxJobsOption = None,
    poll: PollOption = 1.0,
    claim_wait: ClaimWaitOption = 20.0,
    executor: ExecutorOption = WorkerExecutor.process,
    image: ImageOption = None,
    memory: MemoryOption = None,
    cpus: CpusOption = None,
    pids: PidsOption = 1024,
    deadline: DeadlineOption = None,
    allow_tag: AllowTagOption = False,
    cpu_replicas: CpuReplicasOption = None,
    trust_code: TrustCodeOption = False,
    readiness_checks: ReadinessChecksOption = True,
    enroll: EnrollOption = False,
    warm_start: WarmStartOption = True,
    gang_address: GangAddressOption = None,
) -> None:
    """Run a worker agent: claim runs, train each in a fresh process or container, report."""
    _configure_logging()
    if gang_address is not None and executor is not WorkerExecutor.process:
        raise typer.BadParameter(
            "a job in a container has no network to reach the other members: use the "
            "process executor",
            param_hint="--gang-address",
        )
    token = _worker_token(ctx, token, token_file)
    executor_options, images = _executor_setup(
        executor=executor,
        image=image,
        memory=memory,
        cpus=cpus,
        pids=pids,
        deadline=deadline,
        allow_tag=allow_tag,
    )
    if trust_code and executor is WorkerExecutor.process:
        executor_options["trust_code"] = True
    if executor is WorkerExecutor.process:
        executor_options["warm_start"] = warm_start
    _run_worker(
        api,
        token,
        enroll=enroll,
        name=name,
        work_dir=work_dir,
        executor=executor.value,
        executor_options=executor_options,
        poll_interval=poll,
        claim_wait=claim_wait,
        max_jobs=max_jobs,
        images=images,
        cpu_replicas=cpu_replicas,
        readiness_checks=readiness_checks,
        gang_host=gang_address,
    )


def _run_worker(api: str, token: str | None, *, enroll: bool, **options: Any) -> None:
    """The agent until it stops; exit 2 with the reason when it cannot start."""
    from worker.node.agent import WorkDirBusy, default_work_dir, run_agent
    from worker.node.api_errors import ApiError
    from worker.node.enrollment import EnrollmentError, refused_hint
    from worker.node.executors import ExecutorUnavailable
    from worker.node.executors.process import ImageIdentityRefused
    from worker.node.registration import GpusMissing

    try:
        run_agent(api, token, enroll=enroll, **options)
    except (
        ExecutorUnavailable,
        WorkDirBusy,
        EnrollmentError,
        GpusMissing,
        ImageIdentityRefused,
    ) as exc:
        err.print(f"[red]cannot start the worker:[/red] {exc}")
        raise typer.Exit(2) from None
    except ApiError as exc:
        if enroll and exc.status_code == 401:
            hint = refused_hint(options.get("work_dir") or default_work_dir())
        elif exc.status_code in (401, 403):
            sent = "its token was refused" if token else "no token was given"
            hint = (
                f"the API at {api} refused the worker ({exc}): {sent}. A worker needs a "
                "worker token in --token-file FILE or REPRO_TOKEN (an admin makes one with "
                "`repro token create --role worker --name NAME`), or --enroll with an "
                "enrollment token."
            )
        else:
            raise
        err.print(f"[red]cannot start the worker:[/red] {hint}", highlight=False)
        raise typer.Exit(2) from None


db_app = typer.Typer(cls=Group, help="Database maintenance.", no_args_is_help=True)


@db_app.command("upgrade", cls=Command)
def db_upgrade(data_dir: DataDirOption = None, database_url: DatabaseOption = None) -> None:
    """Apply all migrations to the database."""
    from service.persistence.migrate import upgrade

    settings = _settings(data_dir, database_url)
    upgrade(settings.resolved_database_url)
    typer.echo(f"database at head: {settings.resolved_database_url.split('@')[-1]}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the application."""
    app.command(cls=Command)(serve)
    app.command(cls=Command)(worker)
    app.add_typer(db_app, name="db")
