"""The Kubernetes manifests as kustomize renders them, for the tests that read them: any
kustomization's objects, with optional components listed as an operator lists them, and a
worker pool's StatefulSet's worker container, the environment it sets, its ScaledObject and
its query."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

KUBERNETES = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
OVERLAYS = KUBERNETES / "overlays"


@dataclass(frozen=True)
class RenderedPool:
    statefulset: dict[str, Any]
    worker: dict[str, Any]  # the worker container
    scaled: dict[str, Any]  # the ScaledObject

    @property
    def env(self) -> dict[str, str]:
        """The worker's environment variables set by value (not from a field or Secret)."""
        return {e["name"]: e["value"] for e in self.worker["env"] if "value" in e}

    @property
    def query(self) -> str:
        """The KEDA trigger's Prometheus query."""
        (trigger,) = self.scaled["spec"]["triggers"]
        query: str = trigger["metadata"]["query"]
        return query


def kubectl() -> str:
    """The kubectl of the project's environment (the deploy extra), else of PATH."""
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which(
        "kubectl"
    )
    if found is None:
        pytest.fail("kubectl is missing: install the project with its 'deploy' extra")
    return found


def rendered(kustomization: Path) -> list[dict[str, Any]]:
    """The objects the kustomization in the directory `kustomization` renders."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(kustomization)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def with_components(
    tmp_path: Path, target: str, *components: str, **fields: Any
) -> list[dict[str, Any]]:
    """The objects of `target` (base, overlays/gpu, ...) rendered from a copy of the tree in
    which its kustomization lists the named components, as an operator would, and any other
    `fields` given (patches=[...])."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    kustomization = tree / target / "kustomization.yaml"
    config = yaml.safe_load(kustomization.read_text())
    config["components"] = [
        os.path.relpath(tree / "components" / c, kustomization.parent) for c in components
    ]
    config.update(fields)
    kustomization.write_text(yaml.safe_dump(config))
    return rendered(kustomization.parent)


def rendered_pool(overlay: Path) -> RenderedPool:
    """The pool `overlay` (a directory) renders."""
    objects = rendered(overlay)
    (pool,) = [o for o in objects if o["kind"] == "StatefulSet"]
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    (worker,) = pool["spec"]["template"]["spec"]["containers"]
    return RenderedPool(pool, worker, scaled)
