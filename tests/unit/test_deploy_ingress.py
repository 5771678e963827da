"""The Ingress component (deploy/kubernetes/components/ingress) rendered into the base, as an
operator lists it: what it routes from outside the cluster and where, and what it leaves
inside (/metrics and the probes) on any Ingress controller."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.app import create_app
from service.config import Settings
from tests.kustomize import KUBERNETES, with_components

INSIDE = ("/metrics", "/healthz", "/readyz")  # answered only inside the cluster
_NGINX = "nginx.ingress.kubernetes.io/"


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return with_components(tmp_path_factory.mktemp("ingress"), "base", "ingress")


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _ingress(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objects, "Ingress", "reprotrain-api")


def _paths(ingress: dict[str, Any]) -> list[dict[str, Any]]:
    (rule,) = ingress["spec"]["rules"]
    paths: list[dict[str, Any]] = rule["http"]["paths"]
    return paths


def _matches(entry: dict[str, Any], path: str) -> bool:
    """Whether an Ingress path entry matches a request path, as the Ingress API defines it:
    Exact is equality, Prefix compares whole path elements (`/runs` matches `/runs/7`, not
    `/runsets`)."""
    if entry["pathType"] == "Exact":
        return bool(path == entry["path"])
    wanted = [e for e in entry["path"].split("/") if e]
    return [e for e in path.split("/") if e][: len(wanted)] == wanted


def _backend(ingress: dict[str, Any], path: str) -> dict[str, Any] | None:
    """Where the Ingress sends a request for `path` (None: nowhere, the controller answers
    404): the longest matching path, Exact before Prefix at equal length."""
    matching = [e for e in _paths(ingress) if _matches(e, path)]
    if not matching:
        return None
    best = max(matching, key=lambda e: (len(e["path"]), e["pathType"] == "Exact"))
    backend: dict[str, Any] = best["backend"]
    return backend


def _served(routes: Iterable[Any]) -> Iterator[str]:
    """The path template of every route of the app, those of included routers too."""
    for route in routes:
        nested = getattr(route, "effective_route_contexts", None)
        if nested is not None:
            yield from _served(nested())
        else:
            yield route.path


@pytest.fixture(scope="module")
def app_paths(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every path the API process serves, with each parameter filled in."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("data")))
    try:
        templates = set(_served(app.routes))
    finally:
        app.state.engine.dispose()
    paths = {re.sub(r"\{[^}]+\}", "7", t) for t in templates}
    # Every kind of route was found (pages, the REST API, assets, metrics, probes).
    assert {"/", "/login", "/api/v1/runs", "/static/dashboard", *INSIDE} <= paths
    return paths


def test_every_page_and_api_path_reaches_the_api_service(
    objects: list[dict[str, Any]], app_paths: set[str]
) -> None:
    ingress = _ingress(objects)
    service = _one(objects, "Service", "reprotrain-api")
    expected = {"service": {"name": "reprotrain-api", "port": {"name": "http"}}}
    assert {p["name"] for p in service["spec"]["ports"]} == {"http"}
    assert ingress["metadata"]["namespace"] == service["metadata"]["namespace"] == "reprotrain"
    # Portable path types only (ImplementationSpecific means something else on each controller).
    assert {e["pathType"] for e in _paths(ingress)} <= {"Exact", "Prefix"}
    assert all(e["backend"] == expected for e in _paths(ingress))
    outside = sorted(app_paths - set(INSIDE))
    assert not [p for p in outside if _backend(ingress, p) != expected]
    assert "/api/v1/datasets" in outside and "/runs/7/live" in outside  # uploads, event streams


@pytest.mark.parametrize(
    "path", [*INSIDE, "/metrics/", "/metrics/x", "/healthz/", "/readyz/x", "/runsets", "/x"]
)
def test_metrics_probes_and_unknown_paths_are_not_routed(
    objects: list[dict[str, Any]], path: str
) -> None:
    assert _backend(_ingress(objects), path) is None
    assert "defaultBackend" not in _ingress(objects)["spec"]  # nothing catches what is left


def test_tls_covers_the_host_with_the_operators_secret(objects: list[dict[str, Any]]) -> None:
    spec = _ingress(objects)["spec"]
    assert spec["ingressClassName"] == "nginx"
    (rule,) = spec["rules"]
    (tls,) = spec["tls"]
    # The host is written once; the TLS entry copies it.
    assert rule["host"] == "reprotrain.example.com"
    assert tls == {"hosts": [rule["host"]], "secretName": "reprotrain-tls"}


def _nginx_size(value: str) -> int:
    """An nginx size (2g, 512m, 64k, bytes) in bytes."""
    match = re.fullmatch(r"(\d+)([kmg]?)", value.lower())
    assert match, value
    return int(match.group(1)) * 1024 ** "_kmg".index(match.group(2) or "_")


def test_uploads_and_event_streams_get_through(objects: list[dict[str, Any]]) -> None:
    annotations = _ingress(objects)["metadata"]["annotations"]
    settings = Settings()
    limit = _nginx_size(annotations[_NGINX + "proxy-body-size"])
    # The API's own bound on the largest upload from outside the cluster, a dataset push;
    # every other body a client sends is smaller.
    assert limit == settings.max_dataset_bytes == 2 * 1024**3
    assert limit >= max(
        settings.max_code_bundle_bytes,
        settings.max_model_definition_bytes,
        settings.max_result_bytes,
        settings.max_body_bytes,
    )
    # Streamed to the API, which refuses a body without a valid token before it is sent whole.
    assert annotations[_NGINX + "proxy-request-buffering"] == "off"
    assert int(annotations[_NGINX + "proxy-read-timeout"]) >= 3600
    assert int(annotations[_NGINX + "proxy-send-timeout"]) >= 3600
    # No snippets: recent ingress-nginx refuses them unless the cluster's admin allows them.
    assert not [a for a in annotations if "snippet" in a]


def test_the_api_admits_the_ingress_controllers_labelled_namespace(
    objects: list[dict[str, Any]],
) -> None:
    policy = _one(objects, "NetworkPolicy", "reprotrain-api")["spec"]
    (api,) = _one(objects, "Deployment", "reprotrain-api")["spec"]["template"]["spec"]["containers"]
    (port,) = _one(objects, "Service", "reprotrain-api")["spec"]["ports"]
    container_port = {p["name"]: p["containerPort"] for p in api["ports"]}[port["targetPort"]]
    (admitted,) = policy["ingress"]
    assert [p["port"] for p in admitted["ports"]] == [container_port]
    labels = [
        s["namespaceSelector"]["matchLabels"] for s in admitted["from"] if "namespaceSelector" in s
    ]
    assert labels == [{"reprotrain.io/api-clients": "true"}]
    # The component tells the operator to label the controller's namespace with it.
    component = (KUBERNETES / "components" / "ingress" / "kustomization.yaml").read_text()
    assert "reprotrain.io/api-clients=true" in component


def test_ingress_component_is_optional(tmp_path: Path) -> None:
    base = yaml.safe_load((KUBERNETES / "base" / "kustomization.yaml").read_text())
    assert "../components/ingress" not in base.get("components", [])
    assert not [o for o in with_components(tmp_path, "base") if o["kind"] == "Ingress"]
