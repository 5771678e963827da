"""The images' recipes and locks, and the compose and Kubernetes deployments, checked offline.

Renders the kustomize base and each worker-pool overlay with `kubectl kustomize` (an
operator applies the base once and the pools beside it) and validates them against the
Kubernetes schemas; reads the rendered objects for what an operator relies on (GPUs
requested, images pinned by digest, pods non-root on a read-only root, probes, scaling);
validates the compose files against the compose-spec schema; lints the Dockerfiles and
YAML; and checks that the hashed locks pin the tested CUDA/cuDNN set and still satisfy
pyproject.toml.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import ValidationError

from service.config import Settings
from tests.kustomize import with_components
from worker.node.dataset_cache import memory_size
from worker.node.executors.process import job_environment, told_images
from worker.node.registration import POOL, GpusMissing, expected_gpus
from worker.record import hardware

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
LOCKS = DOCKER / "locks"
COMPOSE = ROOT / "deploy" / "compose"
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu")
DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")

# The CUDA/cuDNN wheel set TensorFlow 2.21 was built and tested with (CUDA 12.5, cuDNN 9.3).
TESTED_GPU_SET = {
    "tensorflow": "2.21.0",
    "nvidia-cublas-cu12": "12.5.3.2",
    "nvidia-cuda-cupti-cu12": "12.5.82",
    "nvidia-cuda-nvcc-cu12": "12.5.82",
    "nvidia-cuda-nvrtc-cu12": "12.5.82",
    "nvidia-cuda-runtime-cu12": "12.5.82",
    "nvidia-cudnn-cu12": "9.3.0.75",
    "nvidia-cufft-cu12": "11.2.3.61",
    "nvidia-curand-cu12": "10.3.6.82",
    "nvidia-cusolver-cu12": "11.6.3.83",
    "nvidia-cusparse-cu12": "12.5.1.3",
    "nvidia-nccl-cu12": "2.27.7",
    "nvidia-nvjitlink-cu12": "12.5.82",
}


def _tool(name: str) -> str:
    """A command-line tool from this interpreter's environment (the `deploy` extra)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: install the project with its 'deploy' extra")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


# --- Kubernetes -------------------------------------------------------------------------

# Kubernetes versions the rendered manifests must validate against: the oldest supported
# (fsGroupChangePolicy, StatefulSet PVC retention, batch/v1 TTLs are there) and the newest.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
# The only kinds without a bundled schema: KEDA's and the Prometheus operator's.
CUSTOM_KINDS = ("ScaledObject", "ServiceMonitor")
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def _render(path: Path) -> str:
    out = _run(_tool("kubectl"), "kustomize", str(path))
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(overlay name, its rendered YAML)."""
    name = str(request.param)
    return name, _render(KUBERNETES / "base") + "---\n" + _render(KUBERNETES / "overlays" / name)


def _objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def _pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _worker(objects: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pool's pod spec, its worker container)."""
    pod = _one(objects, "StatefulSet", f"reprotrain-worker-{name}")["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    return pod, worker


def _values(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _validate(path: Path, version: str) -> set[str]:
    """The resources that passed strict validation against `version`; fails on anything else."""
    out = _run(_tool("kubernetes-validate"), "--strict", "-k", version, str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    unchecked = [
        line
        for line in lines
        if not line.startswith("INFO") and not any(kind in line for kind in CUSTOM_KINDS)
    ]
    assert not unchecked, "\n".join(lines)
    assert all(f"version {version[:4]}" in line for line in lines if "passed" in line)
    return {line.split("resource ")[1].split(" ")[0] for line in lines if "passed" in line}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_overlays_pass_strict_kubernetes_schema_validation(
    overlay: tuple[str, str], version: str, tmp_path: Path
) -> None:
    name, rendered = overlay
    path = tmp_path / f"{name}.yaml"
    path.write_text(rendered)
    assert {
        "deployment/reprotrain-api",
        f"statefulset/reprotrain-worker-{name}",
        f"service/reprotrain-worker-{name}",
        f"poddisruptionbudget/reprotrain-worker-{name}",
        "job/reprotrain-migrate",
        "service/reprotrain-api",
        "networkpolicy/reprotrain-workers",
        "networkpolicy/reprotrain-dns",
        "networkpolicy/reprotrain-database",
        "networkpolicy/reprotrain-object-store",
    } <= _validate(path, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_overlays_with_every_component_pass_strict_validation(version: str, tmp_path: Path) -> None:
    base = with_components(tmp_path / "base", "base", "service-monitor", "ingress")
    gpu = with_components(tmp_path / "gpu", "overlays/gpu", "nvidia-runtime", "spot-workers")
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all([*base, *gpu]))
    assert {
        "deployment/reprotrain-api",
        "ingress/reprotrain-api",
        "statefulset/reprotrain-worker-gpu",
    } <= _validate(path, version)


def test_every_image_is_pinned_by_digest(overlay: tuple[str, str]) -> None:
    _, rendered = overlay
    images = {
        where: c["image"] for where, pod in _pod_specs(_objects(rendered)) for c in _containers(pod)
    }
    assert images
    unpinned = {where: image for where, image in images.items() if not DIGEST.match(image)}
    assert not unpinned


def test_every_worker_learns_its_image_and_pool_from_one_place(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    workers = [o for o in objects if o["kind"] == "StatefulSet"]
    assert [w["metadata"]["name"] for w in workers] == [f"reprotrain-worker-{name}"]
    # The overlay's image.yaml, which pin-image.sh writes, is read and never applied.
    (pinned,) = yaml.safe_load_all((KUBERNETES / "overlays" / name / "image.yaml").read_text())
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    _, worker = _worker(objects, name)
    env = _values(worker)
    assert "--executor=process" in worker["args"]
    assert worker["image"] == pinned["data"]["reference"]
    assert DIGEST.match(worker["image"])
    # The registry digest it is pulled by, and the image ID the docker executor pins: the
    # agent advertises both, and its jobs record both as provenance.
    assert env["REPRO_IMAGE_DIGEST"] == env["REPRO_IMAGE_REF"] == worker["image"]
    assert env["REPRO_IMAGE_ID"] == pinned["data"]["id"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", env["REPRO_IMAGE_ID"])
    assert told_images(env) == [env["REPRO_IMAGE_ID"], worker["image"]]
    assert told_images(job_environment(env)) == told_images(env)
    # The pool it advertises is its StatefulSet's name, and the scaler's target.
    assert env[POOL] == f"reprotrain-worker-{name}"
    scaled = _one(objects, "ScaledObject", f"reprotrain-worker-{name}")
    assert scaled["spec"]["scaleTargetRef"]["name"] == env[POOL]


def test_every_pod_is_non_root_with_a_read_only_root(overlay: tuple[str, str]) -> None:
    pods = dict(_pod_specs(_objects(overlay[1])))
    assert {
        "Deployment/reprotrain-api",
        f"StatefulSet/reprotrain-worker-{overlay[0]}",
        "Job/reprotrain-migrate",
    } <= set(pods)
    for where, pod in pods.items():
        pod_ctx = pod.get("securityContext", {})
        assert pod_ctx.get("runAsNonRoot") is True, where
        assert pod_ctx.get("runAsUser", 0) != 0, where
        assert pod_ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert pod.get("automountServiceAccountToken") is False, where
        # A volume's ownership is changed only when its root does not match already.
        if "fsGroup" in pod_ctx:
            assert pod_ctx.get("fsGroupChangePolicy") == "OnRootMismatch", where
        for c in _containers(pod):
            ctx = c.get("securityContext", {})
            assert ctx.get("readOnlyRootFilesystem") is True, (where, c["name"])
            assert ctx.get("allowPrivilegeEscalation") is False, (where, c["name"])
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], (where, c["name"])
            assert not ctx.get("privileged", False), (where, c["name"])
    assert {w for w, pod in pods.items() if "fsGroup" in pod.get("securityContext", {})} == {
        "Deployment/reprotrain-api",
        f"StatefulSet/reprotrain-worker-{overlay[0]}",
    }


def test_gpu_pools_select_one_gpu_product_and_expect_their_gpus(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    pod, worker = _worker(objects, name)
    gpu_containers = [
        c for _, p in _pod_specs(objects) for c in _containers(p) if "gpu" in c["image"]
    ]
    requested = [
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for _, p in _pod_specs(objects)
        for c in _containers(p)
    ]
    expected = int(_values(worker)["REPRO_EXPECT_GPUS"])
    if name == "gpu":
        assert gpu_containers
        for c in gpu_containers:
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1, c["name"]
        assert pod["nodeSelector"] == {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": GPU_PRODUCT,
        }
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
            pod["tolerations"]
        )
        # The agent refuses to register seeing fewer GPUs than the pod was granted.
        assert expected == int(worker["resources"]["limits"]["nvidia.com/gpu"]) == 1
        with pytest.raises(GpusMissing, match="REPRO_EXPECT_GPUS=1"):
            expected_gpus(_values(worker), 0)
        # The runtime class is an opt-in component: a pod naming a missing one is refused.
        assert "runtimeClassName" not in pod
    else:
        assert not gpu_containers
        assert not any(requested)
        assert "nodeSelector" not in pod
        assert expected == 0
    expected_gpus(_values(worker), expected)  # a pod seeing what it was granted registers


def test_nvidia_runtime_component_sets_the_runtime_class(tmp_path: Path) -> None:
    objects = with_components(tmp_path, "overlays/gpu", "nvidia-runtime")
    pod, _ = _worker(objects, "gpu")
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == GPU_PRODUCT


def test_worker_threads_and_job_memory_follow_the_pod_limits(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    _, worker = _worker(_objects(rendered), name)
    refs = {
        e["name"]: e["valueFrom"]["resourceFieldRef"]
        for e in worker["env"]
        if "resourceFieldRef" in e.get("valueFrom", {})
    }
    limits = worker["resources"]["limits"]
    for variable in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
        assert refs[variable] == {
            "containerName": "worker",
            "resource": "limits.cpu",
            "divisor": "1",
        }
    assert _values(worker)["TF_NUM_INTEROP_THREADS"] == "2"
    assert refs["REPRO_WORKER_JOB_MEMORY"] == {
        "containerName": "worker",
        "resource": "limits.memory",
        "divisor": "1",
    }
    # The limits exist (so the references resolve), and the CPU limit is the request: the
    # threads are CPUs the pod is guaranteed.
    assert limits["cpu"] == worker["resources"]["requests"]["cpu"]
    assert int(limits["cpu"]) >= 1
    # The downward API writes the memory limit in bytes; the dataset guard reads that form.
    written = str(_quantity_bytes(limits["memory"]))
    assert memory_size(written) == _quantity_bytes(limits["memory"]) >= 2**30


def _quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (16Gi, 512Mi, 1G, bytes) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(quantity))
    assert match, quantity
    scale = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
    scale |= {"G": 10**9, "T": 10**12, "": 1}
    return int(match.group(1)) * scale[match.group(2) or ""]


def test_workers_get_time_to_checkpoint_and_keep_their_outbox(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    pool = _one(objects, "StatefulSet", f"reprotrain-worker-{name}")
    pod = pool["spec"]["template"]["spec"]
    # SIGTERM's checkpoint fits in the most the cluster autoscaler grants a pod it evicts
    # when it removes a node (--max-graceful-termination-sec, 600 by default).
    assert pod["terminationGracePeriodSeconds"] == 600
    # The outbox lives on a volume of the pod's own, kept when the pod is replaced.
    (claim,) = pool["spec"]["volumeClaimTemplates"]
    (worker,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/lib/reprotrain/work"
    assert "--work-dir=/var/lib/reprotrain/work" in worker["args"]
    assert worker["livenessProbe"]["exec"]["command"][:3] == [
        "python3",
        "-m",
        "worker.node.liveness",
    ]
    pdb = _one(objects, "PodDisruptionBudget", f"reprotrain-worker-{name}")
    assert pdb["spec"]["selector"]["matchLabels"] == pool["spec"]["selector"]["matchLabels"]
    assert "replicas" not in pool["spec"]  # KEDA owns the count


def test_spot_component_fits_the_grace_period_in_the_reclaim_notice(tmp_path: Path) -> None:
    objects = with_components(tmp_path, "overlays/cpu", "spot-workers")
    pod, _ = _worker(objects, "cpu")
    assert pod["terminationGracePeriodSeconds"] == 110  # within AWS's two minutes' notice


def test_each_statefulset_has_its_headless_service(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    pool = _one(objects, "StatefulSet", f"reprotrain-worker-{name}")
    service = _one(objects, "Service", pool["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = pool["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"] == pool["spec"]["selector"]["matchLabels"]


def test_pods_bound_their_ephemeral_storage(overlay: tuple[str, str]) -> None:
    for where, pod in _pod_specs(_objects(overlay[1])):
        for c in _containers(pod):
            assert c["resources"]["requests"]["ephemeral-storage"], (where, c["name"])
            assert c["resources"]["limits"]["ephemeral-storage"], (where, c["name"])
        for volume in pod.get("volumes", []):
            if "emptyDir" in volume:
                assert volume["emptyDir"].get("sizeLimit"), (where, volume["name"])


def _egress(objects: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """Every egress rule of the policies that select a pod with `labels`."""
    rules = []
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        if "Egress" not in policy["spec"]["policyTypes"]:
            continue
        selector = policy["spec"]["podSelector"]
        if not selector.get("matchLabels", {}).items() <= labels.items():
            continue
        if not all(
            labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
        ):
            continue
        rules += policy["spec"].get("egress", [])
    return rules


def test_network_policies_open_only_what_each_pod_needs(overlay: tuple[str, str]) -> None:
    objects = _objects(overlay[1])
    deny = _one(objects, "NetworkPolicy", "reprotrain-default-deny")["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    # Workers are reached only by workers: a gang's jobs, on unprivileged ports.
    gang_ports = [{"protocol": "TCP", "port": 1024, "endPort": 65535}]
    workers = {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}}}
    assert _one(objects, "NetworkPolicy", "reprotrain-workers")["spec"]["ingress"] == [
        {"from": [workers], "ports": gang_ports}
    ]
    dns = {
        "to": [
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}},
            {"ipBlock": {"cidr": "169.254.20.10/32"}},  # NodeLocal DNSCache
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    to_api = {
        "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "reprotrain-api"}}}],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }
    database = {
        "to": [{"ipBlock": {"cidr": "192.0.2.20/32"}}],
        "ports": [{"protocol": "TCP", "port": 5432}],
    }
    store = {
        "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    pods = {
        where: next(o for o in objects if f"{o['kind']}/{o['metadata']['name']}" == where)
        for where, _ in _pod_specs(objects)
    }
    allowed = {
        where: _egress(objects, obj["spec"]["template"]["metadata"]["labels"])
        for where, obj in pods.items()
    }
    name = overlay[0]
    expected = {
        "Deployment/reprotrain-api": [dns, database, store],
        "Job/reprotrain-migrate": [dns, database],
        # Workers, and the jobs they run: the API and, by presigned URL, the store.
        f"StatefulSet/reprotrain-worker-{name}": [
            dns,
            to_api,
            store,
            {"to": [workers], "ports": gang_ports},  # the other members of its gangs
        ],
    }

    def canonical(rules: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        return {w: sorted(json.dumps(r, sort_keys=True) for r in rs) for w, rs in rules.items()}

    assert canonical(allowed) == canonical(expected)
    # Every address is written once: one policy each for the database and the store.
    for rule in (database, store):
        assert (
            sum(
                rule in p["spec"].get("egress", []) for p in objects if p["kind"] == "NetworkPolicy"
            )
            == 1
        )
    api = _one(objects, "NetworkPolicy", "reprotrain-api")["spec"]
    (reached,) = api["ingress"]
    assert [p["port"] for p in reached["ports"]] == [8000]


def test_api_and_job_read_their_secrets(overlay: tuple[str, str]) -> None:
    objects = _objects(overlay[1])
    (api,) = _one(objects, "Deployment", "reprotrain-api")["spec"]["template"]["spec"]["containers"]
    assert api["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    secret_refs = {
        (c["name"], e["name"]): (
            e["valueFrom"]["secretKeyRef"]["name"],
            e["valueFrom"]["secretKeyRef"].get("optional", False),
        )
        for _, pod in _pod_specs(objects)
        for c in _containers(pod)
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert secret_refs == {
        ("api", "REPRO_DATABASE_URL"): ("reprotrain-database", False),
        # The API keeps files in an external object store, and no volume of its own.
        ("api", "REPRO_STORAGE_URL"): ("reprotrain-object-store", False),
        ("api", "REPRO_S3_ENDPOINT_URL"): ("reprotrain-object-store", True),
        ("api", "AWS_ACCESS_KEY_ID"): ("reprotrain-object-store", False),
        ("api", "AWS_SECRET_ACCESS_KEY"): ("reprotrain-object-store", False),
        ("api", "AWS_DEFAULT_REGION"): ("reprotrain-object-store", True),
        # Shared by every replica: a pod making its own would sign what others cannot read.
        ("api", "REPRO_DASHBOARD_SECRET"): ("reprotrain-api-keys", False),
        ("api", "REPRO_PROVENANCE_KEY"): ("reprotrain-api-keys", False),
        # Settings the service runs without: optional.
        ("api", "REPRO_WORKER_IMAGES"): ("reprotrain-api-keys", True),
        ("api", "REPRO_METRICS_TOKEN_REQUIRED"): ("reprotrain-api-keys", True),
        ("migrate", "REPRO_DATABASE_URL"): ("reprotrain-database", False),
        # Workers hold a worker token, never the database's credentials.
        ("worker", "REPRO_TOKEN"): ("reprotrain-worker-token", False),
    }
    # Created by the operator, never kept (with a placeholder) in the repository.
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    deployment = _one(objects, "Deployment", "reprotrain-api")["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"]["type"] == "RollingUpdate"
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    budget = _one(objects, "PodDisruptionBudget", "reprotrain-api")["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"] == deployment["selector"]["matchLabels"]
    assert "--no-migrate" in api["args"]
    assert not any(pod.get("initContainers") for _, pod in _pod_specs(objects))
    # The example Secret's database URL asks for TLS.
    secrets = _objects((KUBERNETES / "secrets.example.yaml").read_text())
    url = _one(secrets, "Secret", "reprotrain-database")["stringData"]["url"]
    assert url.startswith("postgresql+psycopg://") and url.endswith("?sslmode=require")


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process started with `env` (on top of this one's) reads."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_migration_job_stays_for_inspection_and_bounds_its_lock_wait(
    overlay: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = _objects(overlay[1])
    job = _one(objects, "Job", "reprotrain-migrate")
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    assert migrate["args"] == ["db", "upgrade"]
    # Kept a day with its pods (each failed attempt's too), then deleted by Kubernetes.
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert 1 <= job["spec"]["backoffLimit"] <= 5
    # The migrator waits a bounded time for another one's lock, well within the deadline.
    monkeypatch.delenv("REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS", raising=False)
    timeout = _settings_from(_values(migrate), monkeypatch).migration_lock_timeout_seconds
    assert timeout == 300
    assert job["spec"]["activeDeadlineSeconds"] > timeout * (job["spec"]["backoffLimit"] + 1)
    # Argo CD runs it before syncing the API and replaces the previous one; Flux recreates it
    # when it changes. Both are annotations, inert under kubectl.
    assert job["metadata"]["annotations"] == {
        "argocd.argoproj.io/hook": "PreSync",
        "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation",
        "kustomize.toolkit.fluxcd.io/force": "enabled",
    }


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf", "nan"])
def test_migration_lock_timeout_refuses_a_value_that_is_not_a_positive_number(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = "REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS"
    with pytest.raises(ValidationError, match=f"{variable} must be a positive number"):
        _settings_from({variable: value}, monkeypatch)
    monkeypatch.delenv(variable)
    assert Settings().migration_lock_timeout_seconds == 300
    assert _settings_from({variable: " "}, monkeypatch).migration_lock_timeout_seconds == 300
    assert _settings_from({variable: " 2.5 "}, monkeypatch).migration_lock_timeout_seconds == 2.5


def test_each_pool_scales_on_its_own_claimable_runs(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    scaled = _one(objects, "ScaledObject", f"reprotrain-worker-{name}")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": f"reprotrain-worker-{name}",
    }
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"  # the only type KEDA's fallback supports
    query = " ".join(trigger["metadata"]["query"].split())
    _, worker = _worker(objects, name)
    env = _values(worker)
    image_id, digest = env["REPRO_IMAGE_ID"], env["REPRO_IMAGE_DIGEST"]
    # Held runs of this pool only; queued runs for its image, devices and hardware.
    assert f'reprotrain_held_runs{{pool="{env[POOL]}"}}' in query
    assert f'image=~"|{digest}|{image_id}|"' in query
    assert 'code="false"' in query
    if name == "gpu":
        slug = hardware.slug(GPU_PRODUCT)  # the product as workers write it in their class
        assert slug == "nvidia-h100-80gb-hbm3"
        assert 'replicas="1"' in query
        assert f'hardware=~"|gpu|gpu:{slug}(:.*)?"' in query
    else:
        assert 'replicas=~"1|2"' in query
        assert 'hardware=~"|cpu(:.*)?"' in query
    # Fails safe: no zero made up when the metrics are gone, an error instead, and KEDA's
    # fallback keeps the pods there are.
    assert "vector(0)" not in query
    assert query.count("or on() (0 * max(reprotrain_workers_live))") == 2
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    assert scaled["spec"]["fallback"] == {
        "failureThreshold": 3,
        "replicas": 1,
        "behavior": "currentReplicasIfHigher",
    }
    assert trigger["metadata"]["threshold"] == "1"
    # The Prometheus address is written once, in the pool every overlay builds on.
    pool_trigger = yaml.safe_load((KUBERNETES / "pool" / "worker-scaling.yaml").read_text())
    address = pool_trigger["spec"]["triggers"][0]["metadata"]["serverAddress"]
    assert trigger["metadata"]["serverAddress"] == address
    for path in KUBERNETES.rglob("*.yaml"):
        assert "vector(0)" not in path.read_text(), path
        if path != KUBERNETES / "pool" / "worker-scaling.yaml":
            assert not re.search(r"^\s*serverAddress:", path.read_text(), re.M), path


def test_service_monitor_component_scrapes_the_api_with_a_token(tmp_path: Path) -> None:
    objects = with_components(tmp_path, "base", "service-monitor")
    monitor = _one(objects, "ServiceMonitor", "reprotrain-api")
    assert monitor["metadata"]["namespace"] == "reprotrain"
    service = _one(objects, "Service", "reprotrain-api")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"] == {
        "name": "reprotrain-metrics-token",
        "key": "token",
    }


def test_service_monitor_scrapes_without_a_token_with_the_documented_patch(
    tmp_path: Path,
) -> None:
    # The Prometheus operator ignores `optional` on the token's Secret and rejects the
    # ServiceMonitor without it: the README's patch removes the reference instead.
    readme = (ROOT / "deploy" / "README.md").read_text()
    documents = [
        doc
        for block in re.findall(r"```yaml\n(.*?)```", readme, re.S)
        for doc in yaml.safe_load_all(block)
    ]
    (patches,) = [doc["patches"] for doc in documents if isinstance(doc, dict) and "patches" in doc]
    objects = with_components(tmp_path, "base", "service-monitor", patches=patches)
    (endpoint,) = _one(objects, "ServiceMonitor", "reprotrain-api")["spec"]["endpoints"]
    assert "authorization" not in endpoint
    assert endpoint["path"] == "/metrics"
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    assert "deployment/reprotrain-api" in _validate(path, KUBERNETES_VERSIONS[-1])


def test_pools_coexist_in_one_namespace() -> None:
    names = []
    for path in (KUBERNETES / "base", *(KUBERNETES / "overlays" / n for n in OVERLAYS)):
        names += [(o["kind"], o["metadata"]["name"]) for o in _objects(_render(path))]
    assert len(names) == len(set(names)), sorted(names)


def test_deploy_docs_keep_secrets_off_command_lines() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "--from-literal" not in readme
    assert '--from-file=url="$S/database-url"' in readme
    # The image ID is never copied by hand: the one script writes it with the digest.
    assert "pin-image.sh overlays/gpu" in readme
    assert not re.search(r"REPRO_IMAGE_ID\S* in overlays/", readme)


# --- compose ------------------------------------------------------------------------------


def test_compose_files_validate_against_the_compose_spec() -> None:
    files = sorted(COMPOSE.glob("*.yaml"))
    assert {f.name for f in files} == {"compose.yaml", "compose.gpu.yaml"}
    out = _run(
        _tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", *map(str, files)
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_compose_stack_migrates_first_and_shares_the_workspace_path() -> None:
    services = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]
    assert services["api-1"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }
    # The second replica starts once the first is ready (so one of them makes the first
    # admin token), from the same image, settings and shared volume.
    assert services["api-2"]["depends_on"] == {"api-1": {"condition": "service_healthy"}}
    for key in ("image", "command", "environment", "volumes", "healthcheck"):
        assert services["api-2"][key] == services["api-1"][key], key
    # One port in front of both: the proxy, which is what every client and worker reaches.
    proxy = services["api"]
    assert proxy["environment"] == {"REPRO_API_1": "api-1:8000", "REPRO_API_2": "api-2:8000"}
    assert set(proxy["depends_on"]) == {"api-1", "api-2"}
    assert [s for s, spec in services.items() if spec.get("ports") and s.startswith("api")] == [
        "api"
    ]
    assert "--api http://api:8000" in services["worker"]["command"][0]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    worker = services["worker"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in worker["volumes"]
    (workspace,) = [v for v in worker["volumes"] if "REPRO_WORKSPACE" in v]
    host, container = workspace.split("}:", 1)
    assert f"{host}}}" == container  # the job containers mount it by host path
    assert "REPRO_DATABASE_URL" not in worker.get("environment", {})
    # Its own pool: the runs it holds never count for a Kubernetes pool of the same image.
    pool = worker["environment"][POOL]
    assert pool == "${REPRO_WORKER_POOL:-compose}"
    assert not pool.split(":-")[1].rstrip("}").startswith("reprotrain-worker")
    gpu = yaml.safe_load((COMPOSE / "compose.gpu.yaml").read_text())["services"]["worker"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]


def test_deploy_yaml_is_lint_clean() -> None:
    out = _run(
        _tool("yamllint"), "-s", "-c", str(ROOT / "deploy" / ".yamllint.yaml"), str(ROOT / "deploy")
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- images -------------------------------------------------------------------------------


def test_dockerfiles_are_hadolint_clean() -> None:
    dockerfiles = sorted(DOCKER.glob("*Dockerfile"))
    assert {f.name for f in dockerfiles} == {
        "Dockerfile",
        "postgres.Dockerfile",
        "proxy.Dockerfile",
        "s3.Dockerfile",
        "user.Dockerfile",
    }
    out = _run(_tool("hadolint"), *map(str, dockerfiles))
    assert out.returncode == 0, out.stdout + out.stderr
    for f in dockerfiles:
        # BuildKit's bundled frontend: a `# syntax=` line would fetch one from a registry.
        assert not f.read_text().startswith("# syntax"), f.name


def test_worker_images_leave_gpu_visibility_to_whoever_grants_the_gpus() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    instructions = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    # The device plugin (or Docker's --gpus) sets NVIDIA_VISIBLE_DEVICES per container; an
    # image's `all` would give every GPU of a node to a pod that asked for none.
    assert not [line for line in instructions if "NVIDIA_VISIBLE_DEVICES" in line]
    worker_stage = dockerfile.split("AS worker", 1)[1]
    assert "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility" in worker_stage


def _lock(name: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every requirement in docker/locks/<name>.txt."""
    text = (LOCKS / f"{name}.txt").read_text()
    pins: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if match:
            hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
            pins[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return pins


@pytest.mark.parametrize("name", ["api", "cpu", "gpu", "build", "s3"])
def test_every_locked_requirement_has_hashes(name: str) -> None:
    pins = _lock(name)
    assert pins
    assert not {n for n, (_, hashes) in pins.items() if not hashes}


def test_gpu_lock_pins_exactly_the_tested_cuda_and_cudnn_set() -> None:
    pins = _lock("gpu")
    cuda = {n: v for n, (v, _) in pins.items() if n.startswith("nvidia-")}
    expected_cuda = {n: v for n, v in TESTED_GPU_SET.items() if n.startswith("nvidia-")}
    assert cuda == expected_cuda
    assert pins["tensorflow"][0] == "2.21.0"
    assert "tensorflow-cpu" not in pins


def test_cpu_lock_pins_the_tensorflow_the_project_trains_with() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (train,) = [Requirement(r) for r in project["optional-dependencies"]["train"]]
    pins = _lock("cpu")
    assert train.specifier.contains(pins[canonicalize_name(train.name)][0])
    assert not any(n.startswith("nvidia-") for n in pins)
    assert "tensorflow" not in _lock("api") and "tensorflow-cpu" not in _lock("api")


@pytest.mark.parametrize(
    ("name", "extras"), [("api", []), ("cpu", ["docker"]), ("gpu", ["docker"])]
)
def test_locks_satisfy_pyproject(name: str, extras: list[str]) -> None:
    """A dependency added to pyproject.toml without rerunning docker/lock.sh fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    pins = _lock(name)
    stale = [
        str(req)
        for req in wanted
        if canonicalize_name(req.name) not in pins
        or not req.specifier.contains(pins[canonicalize_name(req.name)][0], prereleases=True)
    ]
    assert not stale, f"docker/locks/{name}.txt does not satisfy {stale}: run docker/lock.sh"


def test_build_info_reports_the_gpu_image_versions() -> None:
    out = _run(
        sys.executable,
        str(DOCKER / "build_info.py"),
        "--lock",
        str(LOCKS / "gpu.txt"),
        "--base",
        "debian:bookworm-slim@sha256:" + "0" * 64,
        "--base-digest",
        "sha256:" + "0" * 64,
        "--revision",
        "abc",
        "--version",
        "0.1.0",
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["tensorflow"] == "2.21.0"
    assert info["tensorflow_package"] == "tensorflow"
    assert (info["cuda"], info["cudnn"], info["nccl"]) == ("12.5.82", "9.3.0.75", "2.27.7")
    digest = hashlib.sha256((LOCKS / "gpu.txt").read_bytes()).hexdigest()
    assert info["lock_digest"] == f"sha256:{digest}"
