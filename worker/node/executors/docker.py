"""The docker executor: each job in a fresh, locked-down container of the image its run pins.

Images are known by image ID (and RepoDigests when they came from a registry): the worker
resolves each `--image` to its ID when it starts, advertises the IDs, and creates every
container from an ID, so nothing is pulled and a moved tag cannot change what a run gets.
The image that ran is passed into the job (REPRO_IMAGE_*), which records it as provenance.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import secrets
import socket
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container
from docker.types import DeviceRequest, Mount

from worker.errors import SpecError
from worker.node.executors import ExecutorUnavailable
from worker.node.executors.base import JobRequest, export_environment
from worker.node.executors.docker_job import ContainerJob, OrphanedContainer
from worker.node.executors.process import job_command
from worker.record.gpu_info import gpu_devices
from worker.spec import parse_any_spec
from worker.training.determinism import required_environment

log = logging.getLogger("reprotrain.agent")

LABEL_AGENT = "org.reprotrain.agent"  # the agent instance that started the container
LABEL_HOST = "org.reprotrain.agent-host"
LABEL_RUN = "org.reprotrain.run"
# Set by docker/build.sh: the commit the image's source was built from, and if it was dirty.
REVISION_LABEL = "org.opencontainers.image.revision"
REVISION_DIRTY_LABEL = "org.reprotrain.revision-dirty"
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
WORKSPACE = Path("/job")  # where the per-run workspace is mounted in the container
DATASETS = Path("/datasets")  # where the run's dataset file is mounted, read-only
NOBODY = (65534, 65534)
# What the determinism environment takes from the agent's: variables read by TensorFlow, the
# math libraries or the interpreter. Paths, proxies, tokens and the like stay on the host.
_PASSED_ENV = re.compile(
    r"(?:TF|CUDA|CUDNN|XLA|OMP|MKL|KMP|OPENBLAS|ONEDNN|DNNL)_"
    r"|(?:PYTHONHASHSEED|CUBLAS_WORKSPACE_CONFIG)$"
)
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


class ImageRefused(ValueError):
    """The run's image cannot run on this worker (a bare tag, or not one of its images)."""


@dataclass(frozen=True)
class ImageIdentity:
    """A local image as the worker knows it."""

    id: str  # sha256:... of the image config: the same on every host holding the image
    repo_digests: tuple[str, ...]  # name@sha256:... of the registry manifest, when pulled
    reference: str  # the name the operator gave it
    user: str  # the image's configured user ("" is root)
    # The commit its source was built from (its OCI revision label), and whether that tree had
    # uncommitted changes; None when the image does not say.
    revision: str | None = None
    revision_dirty: bool | None = None

    def provenance(self) -> dict[str, Any]:
        """The fields a job records under provenance.image."""
        return {"id": self.id, "repo_digests": list(self.repo_digests), "reference": self.reference}

    def environment(self) -> dict[str, str]:
        """The same, as the variables the job reads them from (and the commit it records)."""
        env = {
            "REPRO_IMAGE_ID": self.id,
            "REPRO_IMAGE_REPO_DIGESTS": ",".join(self.repo_digests),
            "REPRO_IMAGE_DIGEST": self.repo_digests[0] if self.repo_digests else "",
            "REPRO_IMAGE_REF": self.reference,
        }
        if self.revision is not None:
            env["REPRO_GIT_COMMIT"] = self.revision
            if self.revision_dirty is not None:
                env["REPRO_GIT_DIRTY"] = "true" if self.revision_dirty else "false"
        return env


def _is_pinned(reference: str) -> bool:
    return reference.startswith("sha256:") or "@sha256:" in reference


def container_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The determinism environment for a job container: what the process executor's job
    gets that matters to numerics, without the host's paths and secrets."""
    source = dict(os.environ if environ is None else environ)
    env = {
        name: value
        for name, value in source.items()
        if _PASSED_ENV.match(name) and not any(m in name.upper() for m in _SECRET_MARKERS)
    }
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["HOME"] = "/tmp"  # the root file system is read-only; Keras keeps its config in HOME
    return env


def agent_instance() -> str:
    """This process's identity on this host: boot, pid and start time (pids get reused)."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}/{os.getpid()}/{_start_time(os.getpid())}"


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime), counted after the parenthesised command name, which may hold spaces.
    return stat.rsplit(")", 1)[1].split()[19]


def _instance_alive(instance: str) -> bool:
    boot, _, rest = instance.partition("/")
    pid, _, started = rest.partition("/")
    if boot != Path("/proc/sys/kernel/random/boot_id").read_text().strip() or not pid.isdigit():
        return False
    return _start_time(int(pid)) == started


class DockerExecutor:
    """Runs each job in a fresh container: no network, read-only root, limits, no privileges."""

    kind = "docker"
    # Every job is sandboxed (no network, read-only root, no capabilities): code bundles run.
    accepts_code = True

    def __init__(
        self,
        *,
        images: Sequence[str] = (),
        allow_tag: bool = False,
        memory: str | None = None,
        cpus: float | None = None,
        pids: int | None = 1024,
        deadline: float | None = None,
        tmp_size: str = "1g",
        gpus: bool | None = None,
        client: docker.DockerClient | None = None,
    ) -> None:
        if not images:
            raise ExecutorUnavailable(
                "the docker executor runs jobs in the images named with --image; name one"
            )
        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except _ENGINE_ERRORS as exc:
            raise ExecutorUnavailable(f"no Docker engine is reachable ({exc})") from None
        self.allow_tag = allow_tag
        self.memory = memory
        self.cpus = cpus
        self.pids = pids
        self.deadline = deadline
        self.tmp_size = tmp_size
        self.images = [self._identify(ref) for ref in images]
        self.gpus = self._host_has_gpus() if gpus is None else gpus
        self.host = socket.gethostname()
        self.instance = agent_instance()

    def _identify(self, reference: str) -> ImageIdentity:
        try:
            image = self.client.images.get(reference)
        except docker.errors.ImageNotFound:
            raise ExecutorUnavailable(
                f"image {reference!r} is not on this Docker engine (build, load or pull it first)"
            ) from None
        config = image.attrs.get("Config") or {}
        labels = config.get("Labels") or {}
        revision = str(labels.get(REVISION_LABEL) or "")
        dirty = str(labels.get(REVISION_DIRTY_LABEL) or "")
        return ImageIdentity(
            id=str(image.id),
            repo_digests=tuple(image.attrs.get("RepoDigests") or ()),
            reference=reference,
            user=str(config.get("User") or ""),
            # Images the job records from: an image built outside a checkout says "unknown".
            revision=revision if _COMMIT.fullmatch(revision) else None,
            revision_dirty={"true": True, "false": False}.get(dirty),
        )

    def _host_has_gpus(self) -> bool:
        # A GPU device request without the NVIDIA runtime fails every container at start().
        if not gpu_devices():
            return False
        runtimes = self.client.info().get("Runtimes") or {}
        if "nvidia" not in runtimes:
            log.warning("this host has GPUs but Docker has no NVIDIA runtime: jobs run on CPU")
            return False
        return True

    # -- what the worker advertises ----------------------------------------------------------

    def advertised_images(self) -> list[str]:
        """Image IDs and RepoDigests of the configured images (and their tags if allowed)."""
        names: list[str] = []
        for image in self.images:
            names += [image.id, *image.repo_digests]
            if self.allow_tag or _is_pinned(image.reference):
                names.append(image.reference)
        return list(dict.fromkeys(names))

    def image_provenance(self) -> dict[str, Any] | None:
        """The image a run that pins none runs in (the first configured one)."""
        return self.images[0].provenance()

    def image_for(self, pinned: str | None) -> ImageIdentity:
        """The configured image a run pinning `pinned` runs in; ImageRefused if none may."""
        if pinned is None:
            return self.images[0]
        if not _is_pinned(pinned) and not self.allow_tag:
            raise ImageRefused(
                f"image {pinned!r} is a tag without a digest: pin it by digest or image ID "
                "(or start the worker with --allow-tag)"
            )
        for image in self.images:
            if pinned == image.id or pinned in image.repo_digests or pinned == image.reference:
                return image
        raise ImageRefused(f"image {pinned!r} is not one of this worker's images")

    # -- running a job -----------------------------------------------------------------------

    def start(self, request: JobRequest) -> ContainerJob:
        """Create and start the job's container; it runs until it ends or is signalled."""
        image = self.image_for(request.image)
        inside = [WORKSPACE / p.relative_to(request.attempt_dir) for p in _job_paths(request)]
        spec, out, checkpoints = inside
        mounts, (dataset, code, model) = _job_mounts(request)
        argv = job_command(
            spec,
            out,
            checkpoint_dir=checkpoints,
            resume=request.resume,
            max_model_parameters=request.max_model_parameters,
            max_activation_elements=request.max_activation_elements,
            trace_every_steps=request.trace_every_steps,
            until_epoch=request.until_epoch,
            until_step=request.until_step,
            dataset_file=dataset,
            code_file=code,
            model_file=model,
        )
        env = {**container_environment(), **_spec_environment(request.spec_path)}
        env.update(image.environment())
        env.update(request.environment)
        env.update(export_environment(request, WORKSPACE))
        device_requests = []
        if self.gpus:
            device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
            # With only the "gpu" capability the runtime would mount no driver libraries.
            env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        container: Container = self.client.containers.create(
            image.id,  # by ID: create() never pulls, and nothing can retag it underneath
            entrypoint=["python3", *argv[1:]],
            user=self._job_user(image),
            environment=env,
            working_dir=str(WORKSPACE),
            labels={
                **self.agent_labels(),
                LABEL_RUN: str(request.run_id),
            },
            name=f"reprotrain-run-{request.run_id}-{secrets.token_hex(4)}",
            init=True,  # docker-init passes signals on and reaps, whatever the image's entrypoint
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.tmp_size}"},
            mounts=mounts,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=self.memory,
            memswap_limit=self.memory,  # no swap: over the limit is an OOM, not a slow job
            nano_cpus=int(self.cpus * 1e9) if self.cpus else None,
            pids_limit=self.pids,
            device_requests=device_requests,
            stdin_open=False,
            tty=False,
        )
        try:
            self._own_workspace(container, request.attempt_dir)
            container.start()
        except BaseException:
            container.remove(force=True)
            raise
        log.info(
            "run %s: container %s of image %s (%s)",
            request.run_id,
            container.short_id,
            image.id[:19],
            image.reference,
        )
        return ContainerJob(
            container,
            result_path=request.result_path,
            memory_limit=self.memory,
            deadline_seconds=self.deadline,
        )

    def _job_user(self, image: ImageIdentity) -> str:
        if os.geteuid() != 0:
            # The workspace belongs to the agent's user: the job runs as that user.
            return f"{os.geteuid()}:{os.getegid()}"
        if image.user in ("", "0", "root") or image.user.startswith(("0:", "root:")):
            return "{}:{}".format(*NOBODY)  # never root, even for an image that would be
        return image.user

    def _own_workspace(self, container: Container, workspace: Path) -> None:
        # A root-owned bind mount is not writable by a non-root job user: hand it over.
        if os.geteuid() != 0:
            return
        uid, gid = _numeric_user(container, str(container.attrs["Config"]["User"]))
        for root, dirs, files in os.walk(workspace):
            os.chown(root, uid, gid)
            for name in (*dirs, *files):
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)

    def agent_labels(self) -> dict[str, str]:
        """The labels of every container this agent starts, by which a later agent on this
        host finds what it left."""
        return {LABEL_AGENT: self.instance, LABEL_HOST: self.host}

    def orphaned_jobs(self) -> list[OrphanedContainer]:
        """This host's job containers whose agent is no longer running (running or not),
        for the agent to adopt or remove. Other containers such an agent left (its
        reproducibility checks') are removed here."""
        found = self.client.containers.list(
            all=True,
            filters={"label": f"{LABEL_HOST}={self.host}"},
            ignore_removed=True,  # another agent on this host may remove its own meanwhile
        )
        orphans = []
        for container in found:
            owner = str(container.labels.get(LABEL_AGENT, ""))
            if owner == self.instance or _instance_alive(owner):
                continue
            if LABEL_RUN not in container.labels:
                log.info("removing container %s that a killed agent left", container.short_id)
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
                continue
            orphan = OrphanedContainer(
                container,
                run_id=str(container.labels.get(LABEL_RUN, "")),
                workspace_mount=WORKSPACE,
                memory_limit=self.memory,
                deadline_seconds=self.deadline,
            )
            orphans.append(orphan)
        return orphans

    def reap_orphans(self) -> None:
        """Remove this host's job containers whose agent is no longer running."""
        for orphan in self.orphaned_jobs():
            orphan.remove("the agent that started it is gone")


def _spec_environment(spec_path: Path) -> dict[str, str]:
    """What the job's determinism needs at interpreter start, so it need not re-execute
    itself (a second TensorFlow start-up); an unreadable spec is the job's to report."""
    try:
        spec = parse_any_spec(json.loads(spec_path.read_text()))
    except (OSError, ValueError, SpecError):
        return {}
    return required_environment(spec.determinism)


def _job_paths(request: JobRequest) -> list[Path]:
    return [request.spec_path, request.result_path, request.checkpoint_dir]


def _numeric_user(container: Container, user: str) -> tuple[int, int]:
    """The uid and gid a container's `user` ("uid[:gid]" or "name[:group]") runs as."""
    name, _, group = user.partition(":")
    passwd = _read_file(container, "/etc/passwd") if not name.isdigit() else ""
    uid = gid = None
    if name.isdigit():
        uid = int(name)
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) > 3 and fields[0] == name:
            uid, gid = int(fields[2]), int(fields[3])
    if uid is None:
        raise ImageRefused(f"the image's user {name!r} is not in its /etc/passwd")
    if group.isdigit():
        gid = int(group)
    elif group:
        for line in _read_file(container, "/etc/group").splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[0] == group:
                gid = int(fields[2])
    return uid, gid if gid is not None else uid


def _read_file(container: Container, path: str) -> str:
    """A small text file from a created (not necessarily started) container."""
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        member = archive.extractfile(Path(path).name)
        return member.read().decode("utf-8", "replace") if member else ""


def _job_mounts(request: JobRequest) -> tuple[list[Mount], tuple[Path | None, ...]]:
    """The workspace, and the verified inputs read-only: (mounts, (dataset, code, model))."""
    mounts = [Mount(str(WORKSPACE), str(request.attempt_dir), type="bind")]
    dataset = code = model = None
    if request.dataset_file is not None:
        # The node's verified cache file, read-only: the job cannot alter what it checks.
        dataset = DATASETS / request.dataset_file.name
        mounts.append(Mount(str(dataset), str(request.dataset_file), type="bind", read_only=True))
    if request.code_file is not None:
        # The wheel sits in the workspace; mounted over itself read-only, so the job
        # installs exactly the bytes the agent verified.
        code = WORKSPACE / request.code_file.relative_to(request.attempt_dir)
        mounts.append(Mount(str(code), str(request.code_file), type="bind", read_only=True))
    if request.model_file is not None:  # likewise: the definition the agent verified
        model = WORKSPACE / request.model_file.relative_to(request.attempt_dir)
        mounts.append(Mount(str(model), str(request.model_file), type="bind", read_only=True))
    return mounts, (dataset, code, model)
