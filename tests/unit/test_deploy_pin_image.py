"""deploy/kubernetes/pin-image.sh: a pool's registry digest and image ID written together.

The script runs for real on a copy of deploy/kubernetes, against a stand-in for the docker
CLI that answers `image inspect` and `pull` from a small table of images (this machine's
engine has none pushed to a registry); the copy's overlay is then rendered with kustomize,
as an operator would apply it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kustomize import rendered_pool

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
REPOSITORY = "registry.example.com:5000/team/reprotrain-worker-gpu"
DIGEST_REF = f"{REPOSITORY}@sha256:" + "a1" * 32
IMAGE_ID = "sha256:" + "b2" * 32

# Answers the few docker commands pin-image.sh runs from docker-state.json beside it:
# "local" images (this engine's), "registry" images (pullable), and every call made.
FAKE_DOCKER = """#!{python}
import json, sys
from pathlib import Path

state_path = Path(__file__).with_name("docker-state.json")
state = json.loads(state_path.read_text())
args = sys.argv[1:]
state["calls"].append(args)
state_path.write_text(json.dumps(state))


def find(images, ref):
    return next((i for i in images if ref in (i["id"], *i["tags"], *i["repo_digests"])), None)


if args[:2] == ["image", "inspect"]:
    fmt, ref = (args[3], args[4]) if args[2] == "--format" else (None, args[2])
    image = find(state["local"], ref)
    if image is None:
        sys.exit("Error response from daemon: No such image: " + ref)
    if fmt is None:
        print(json.dumps([image]))
    elif fmt == "{{{{.Id}}}}":
        print(image["id"])
    elif fmt == "{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}":
        print("".join(d + "\\n" for d in image["repo_digests"]))
    else:
        sys.exit("unexpected format " + fmt)
elif args[0] == "pull":
    image = find(state["registry"], args[-1])
    if image is None:
        sys.exit("manifest unknown: " + args[-1])
    state["local"].append(image)
    state_path.write_text(json.dumps(state))
else:
    sys.exit("unexpected docker command: " + " ".join(args))
"""


class Engine:
    """The stand-in docker CLI on PATH, its images and the calls it got."""

    def __init__(self, directory: Path) -> None:
        self.bin = directory
        self.state = directory / "docker-state.json"
        directory.mkdir()
        docker = directory / "docker"
        docker.write_text(FAKE_DOCKER.format(python=sys.executable))
        docker.chmod(0o755)
        self.state.write_text(json.dumps({"local": [], "registry": [], "calls": []}))

    def add(self, where: str, *, image_id: str, tags: list[str], repo_digests: list[str]) -> None:
        state = json.loads(self.state.read_text())
        state[where].append({"id": image_id, "tags": tags, "repo_digests": repo_digests})
        self.state.write_text(json.dumps(state))

    @property
    def calls(self) -> list[list[str]]:
        calls: list[list[str]] = json.loads(self.state.read_text())["calls"]
        return calls


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes to pin images in."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    return copy


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(tmp_path / "bin")


def pin(tree: Path, engine: Engine, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{engine.bin}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DOCKER", None)
    return subprocess.run(
        ["bash", str(tree / "pin-image.sh"), *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def assert_pinned(overlay: Path, reference: str, image_id: str) -> None:
    pool = rendered_pool(overlay)
    env = pool.env
    assert pool.worker["image"] == env["REPRO_IMAGE_DIGEST"] == env["REPRO_IMAGE_REF"] == reference
    assert env["REPRO_IMAGE_ID"] == image_id
    assert f'image=~"|{reference}|{image_id}|"' in " ".join(pool.query.split())


def test_pins_the_digest_and_image_id_together(tree: Path, engine: Engine) -> None:
    engine.add("local", image_id=IMAGE_ID, tags=[], repo_digests=[DIGEST_REF])
    kustomization = (tree / "overlays" / "gpu" / "kustomization.yaml").read_text()
    out = pin(tree, engine, str(tree / "overlays" / "gpu"), DIGEST_REF)
    assert out.returncode == 0, out.stderr
    assert DIGEST_REF in out.stdout and IMAGE_ID in out.stdout
    assert_pinned(tree / "overlays" / "gpu", DIGEST_REF, IMAGE_ID)
    # Only image.yaml changed, it stays lint-clean, and nothing was pulled.
    assert (tree / "overlays" / "gpu" / "kustomization.yaml").read_text() == kustomization
    assert [c[0] for c in engine.calls] == ["image", "image"]
    yamllint = shutil.which("yamllint", path=str(Path(sys.executable).parent)) or "yamllint"
    lint = subprocess.run(
        [yamllint, "-s", "-c", str(ROOT / "deploy" / ".yamllint.yaml"), str(tree / "overlays")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout
    assert not list((tree / "overlays" / "gpu").glob(".image.yaml.*"))  # no temporary left


def test_resolves_a_pushed_tag_to_its_registry_digest(tree: Path, engine: Engine) -> None:
    tag = f"{REPOSITORY}:0.2.0"  # a registry with a port: the tag is the last ':'
    mirror = "mirror.example/team/reprotrain-worker-gpu@sha256:" + "c3" * 32
    engine.add("local", image_id=IMAGE_ID, tags=[tag], repo_digests=[mirror, DIGEST_REF])
    out = pin(tree, engine, str(tree / "overlays" / "cpu") + "/", tag)
    assert out.returncode == 0, out.stderr
    assert_pinned(tree / "overlays" / "cpu", DIGEST_REF, IMAGE_ID)


def test_pulls_an_image_this_engine_does_not_have(tree: Path, engine: Engine) -> None:
    engine.add("registry", image_id=IMAGE_ID, tags=[], repo_digests=[DIGEST_REF])
    out = pin(tree, engine, str(tree / "overlays" / "gpu"), DIGEST_REF)
    assert out.returncode == 0, out.stderr
    assert ["pull", "--quiet", DIGEST_REF] in engine.calls
    assert_pinned(tree / "overlays" / "gpu", DIGEST_REF, IMAGE_ID)


def test_refuses_a_tag_that_was_never_pushed(tree: Path, engine: Engine) -> None:
    before = (tree / "overlays" / "gpu" / "image.yaml").read_text()
    engine.add("local", image_id=IMAGE_ID, tags=[f"{REPOSITORY}:dev"], repo_digests=[])
    out = pin(tree, engine, str(tree / "overlays" / "gpu"), f"{REPOSITORY}:dev")
    assert out.returncode == 1
    assert "give the digest docker push printed" in out.stderr
    assert (tree / "overlays" / "gpu" / "image.yaml").read_text() == before


def test_refuses_an_engine_answer_that_is_not_an_image_id(tree: Path, engine: Engine) -> None:
    before = (tree / "overlays" / "gpu" / "image.yaml").read_text()
    engine.add("local", image_id="sha256:short", tags=[], repo_digests=[DIGEST_REF])
    out = pin(tree, engine, str(tree / "overlays" / "gpu"), DIGEST_REF)
    assert out.returncode == 1
    assert "no image ID" in out.stderr
    assert (tree / "overlays" / "gpu" / "image.yaml").read_text() == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "OVERLAY IMAGE"),
        (["{tree}/overlays/gpu"], "OVERLAY IMAGE"),
        (["{tree}/overlays/gpu", DIGEST_REF, "extra"], "OVERLAY IMAGE"),
        (["{tree}/nowhere", DIGEST_REF], "not a kustomize overlay"),
        (["{tree}/base", DIGEST_REF], "no image.yaml"),
        (
            ["{tree}/overlays/gpu", "Registry.example/Team/Worker@sha256:" + "a1" * 32],
            "not an image",
        ),
        (["{tree}/overlays/gpu", f"{REPOSITORY}@sha256:abc"], "not an image reference"),
        (["{tree}/overlays/gpu", f"{REPOSITORY} :latest"], "not an image reference"),
    ],
)
def test_checks_its_arguments_before_asking_the_engine(
    tree: Path, engine: Engine, args: list[str], message: str
) -> None:
    before = (tree / "overlays" / "gpu" / "image.yaml").read_text()
    out = pin(tree, engine, *(a.format(tree=tree) for a in args))
    assert out.returncode == 2
    assert message in out.stderr
    assert engine.calls == []
    assert (tree / "overlays" / "gpu" / "image.yaml").read_text() == before
