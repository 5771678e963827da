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

from worker.node.executors.process import job_environment, told_images

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


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(overlay name, its rendered YAML)."""
    kubectl = _tool("kubectl")  # renders the kustomize overlays
    name = str(request.param)
    base = _run(kubectl, "kustomize", str(KUBERNETES / "base"))
    assert base.returncode == 0, base.stderr
    out = _run(kubectl, "kustomize", str(KUBERNETES / "overlays" / name))
    assert out.returncode == 0, out.stderr
    return name, base.stdout + "---\n" + out.stdout


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


def test_overlays_pass_strict_kubernetes_schema_validation(
    overlay: tuple[str, str], tmp_path: Path
) -> None:
    name, rendered = overlay
    path = tmp_path / f"{name}.yaml"
    path.write_text(rendered)
    out = _run(_tool("kubernetes-validate"), "--strict", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    # Only KEDA's custom resource has no bundled schema; everything else must have passed.
    unchecked = [
        line for line in lines if not line.startswith("INFO") and "ScaledObject" not in line
    ]
    assert not unchecked, "\n".join(lines)
    passed = {line.split("resource ")[1].split(" ")[0] for line in lines if "passed" in line}
    assert {
        "deployment/reprotrain-api",
        f"statefulset/reprotrain-worker-{name}",
        f"poddisruptionbudget/reprotrain-worker-{name}",
        "job/reprotrain-migrate",
        "service/reprotrain-api",
        "networkpolicy/reprotrain-workers",
    } <= passed


def test_every_image_is_pinned_by_digest(overlay: tuple[str, str]) -> None:
    _, rendered = overlay
    images = {
        where: c["image"] for where, pod in _pod_specs(_objects(rendered)) for c in _containers(pod)
    }
    assert images
    unpinned = {where: image for where, image in images.items() if not DIGEST.match(image)}
    assert not unpinned


def test_every_worker_learns_its_image(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    workers = [o for o in objects if o["kind"] == "StatefulSet"]
    assert [w["metadata"]["name"] for w in workers] == [f"reprotrain-worker-{name}"]
    for pool in workers:
        for worker in pool["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e["value"] for e in worker["env"] if "value" in e}
            assert "--executor=process" in worker["args"]
            assert DIGEST.match(worker["image"])
            # The registry digest it is pulled by, and the image ID the docker executor pins:
            # the agent advertises both, and its jobs record both as provenance.
            assert env["REPRO_IMAGE_DIGEST"] == env["REPRO_IMAGE_REF"] == worker["image"]
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", env["REPRO_IMAGE_ID"] or "")
            assert told_images(env) == [env["REPRO_IMAGE_ID"], worker["image"]]
            assert told_images(job_environment(env)) == told_images(env)


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
        for c in _containers(pod):
            ctx = c.get("securityContext", {})
            assert ctx.get("readOnlyRootFilesystem") is True, (where, c["name"])
            assert ctx.get("allowPrivilegeEscalation") is False, (where, c["name"])
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], (where, c["name"])
            assert not ctx.get("privileged", False), (where, c["name"])


def test_gpu_workers_request_gpus_and_cpu_workers_do_not(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    worker_pod = _one(objects, "StatefulSet", f"reprotrain-worker-{name}")["spec"]["template"][
        "spec"
    ]
    gpu_containers = [
        c for _, pod in _pod_specs(objects) for c in _containers(pod) if "gpu" in c["image"]
    ]
    requested = [
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for _, pod in _pod_specs(objects)
        for c in _containers(pod)
    ]
    if name == "gpu":
        assert gpu_containers
        for c in gpu_containers:
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1, c["name"]
        assert worker_pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
            worker_pod["tolerations"]
        )
    else:
        assert not gpu_containers
        assert not any(requested)
        assert "nodeSelector" not in worker_pod


def test_workers_get_time_to_checkpoint_and_keep_their_outbox(overlay: tuple[str, str]) -> None:
    name, rendered = overlay
    objects = _objects(rendered)
    pool = _one(objects, "StatefulSet", f"reprotrain-worker-{name}")
    pod = pool["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 300
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


def test_pods_bound_their_ephemeral_storage(overlay: tuple[str, str]) -> None:
    for where, pod in _pod_specs(_objects(overlay[1])):
        for c in _containers(pod):
            assert c["resources"]["requests"]["ephemeral-storage"], (where, c["name"])
            assert c["resources"]["limits"]["ephemeral-storage"], (where, c["name"])
        for volume in pod.get("volumes", []):
            if "emptyDir" in volume:
                assert volume["emptyDir"].get("sizeLimit"), (where, volume["name"])


def test_workers_reach_only_the_api(overlay: tuple[str, str]) -> None:
    objects = _objects(overlay[1])
    deny = _one(objects, "NetworkPolicy", "reprotrain-default-deny")["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    workers = _one(objects, "NetworkPolicy", "reprotrain-workers")["spec"]
    assert workers["ingress"] == []
    to_api, dns, to_store = workers["egress"]
    assert to_api["to"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "reprotrain-api"}}}
    ]
    assert {p["port"] for p in dns["ports"]} == {53}
    # The object store by one address only (presigned URLs), the same the API reaches.
    (store,) = to_store["to"]
    assert set(store) == {"ipBlock"} and store["ipBlock"]["cidr"].endswith("/32")
    api_egress = _one(objects, "NetworkPolicy", "reprotrain-api")["spec"]["egress"]
    assert to_store in api_egress
    pool = _one(objects, "StatefulSet", f"reprotrain-worker-{overlay[0]}")
    labels = pool["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "worker"
    api = _one(objects, "NetworkPolicy", "reprotrain-api")["spec"]
    (allowed,) = api["ingress"]
    assert [p["port"] for p in allowed["ports"]] == [8000]


def test_api_probes_and_secrets(overlay: tuple[str, str]) -> None:
    objects = _objects(overlay[1])
    (api,) = _one(objects, "Deployment", "reprotrain-api")["spec"]["template"]["spec"]["containers"]
    assert api["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    secret_refs = {
        (c["name"], e["name"]): e["valueFrom"]["secretKeyRef"]["name"]
        for _, pod in _pod_specs(objects)
        for c in _containers(pod)
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert secret_refs == {
        ("api", "REPRO_DATABASE_URL"): "reprotrain-database",
        # The API keeps files in an external object store, and no volume of its own.
        ("api", "REPRO_STORAGE_URL"): "reprotrain-object-store",
        ("api", "REPRO_S3_ENDPOINT_URL"): "reprotrain-object-store",
        ("api", "AWS_ACCESS_KEY_ID"): "reprotrain-object-store",
        ("api", "AWS_SECRET_ACCESS_KEY"): "reprotrain-object-store",
        ("api", "AWS_DEFAULT_REGION"): "reprotrain-object-store",
        ("api", "REPRO_DASHBOARD_SECRET"): "reprotrain-api-keys",
        ("api", "REPRO_PROVENANCE_KEY"): "reprotrain-api-keys",
        ("migrate", "REPRO_DATABASE_URL"): "reprotrain-database",
        # Workers hold a worker token, never the database's credentials.
        ("worker", "REPRO_TOKEN"): "reprotrain-worker-token",
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
    job = _one(objects, "Job", "reprotrain-migrate")
    migrate = job["spec"]["template"]["spec"]
    assert migrate["containers"][0]["args"] == ["db", "upgrade"]
    # The Job is the one migrator; it is gone once done, so the next apply creates it anew.
    assert "--no-migrate" in api["args"]
    assert job["spec"]["ttlSecondsAfterFinished"] == 0
    assert not any(pod.get("initContainers") for _, pod in _pod_specs(objects))


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
    query = trigger["metadata"]["query"]
    # What it counts is checked against a real scrape in
    # tests/integration/test_pool_scaling_metrics.py.
    assert "reprotrain_held_runs" in query and "reprotrain_queued_runs" in query
    assert "|ID|" not in query and "DIGEST" not in query  # the pool's identities filled in
    assert trigger["metadata"]["threshold"] == "1"


def test_pools_coexist_in_one_namespace() -> None:
    kubectl = _tool("kubectl")
    names = []
    for path in (KUBERNETES / "base", *(KUBERNETES / "overlays" / n for n in OVERLAYS)):
        out = _run(kubectl, "kustomize", str(path))
        assert out.returncode == 0, out.stderr
        names += [(o["kind"], o["metadata"]["name"]) for o in _objects(out.stdout)]
    assert len(names) == len(set(names)), sorted(names)


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
