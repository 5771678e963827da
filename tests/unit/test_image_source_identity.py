"""What an image says about its source: the commit its jobs record as package.git_commit,
whether the tree was dirty, and an OCI source label that is a fetchable URL or absent."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from worker.record.provenance import build_info_commit

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMMIT = "c0b48bf67a2161e66ba6353ad5ce852c103a7cb7"


def _build_info(tmp_path: Path, *revision_args: str) -> dict[str, object]:
    out = subprocess.run(
        [
            sys.executable,
            str(DOCKER / "build_info.py"),
            "--lock",
            str(DOCKER / "locks" / "cpu.txt"),
            "--base",
            "reprotrain-base:bookworm",
            "--base-digest",
            "sha256:" + "0" * 64,
            "--version",
            importlib.metadata.version("reprotrain"),
            *revision_args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    info: dict[str, object] = json.loads(out.stdout)
    (tmp_path / "build-info.json").write_text(out.stdout)
    return info


def test_a_job_in_an_image_records_the_commit_its_build_info_names(tmp_path: Path) -> None:
    info = _build_info(tmp_path, "--revision", COMMIT, "--revision-dirty", "true")
    assert info["revision"] == COMMIT and info["revision_dirty"] is True
    assert build_info_commit(tmp_path / "build-info.json") == (COMMIT, True)

    _build_info(tmp_path, "--revision", COMMIT, "--revision-dirty", "false")
    assert build_info_commit(tmp_path / "build-info.json") == (COMMIT, False)
    _build_info(tmp_path, "--revision", COMMIT)  # an older build.sh: dirtiness unknown
    assert build_info_commit(tmp_path / "build-info.json") == (COMMIT, None)


def test_no_commit_from_a_build_outside_git_another_version_or_no_image(tmp_path: Path) -> None:
    _build_info(tmp_path, "--revision", "unknown")
    assert build_info_commit(tmp_path / "build-info.json") == (None, None)

    info = _build_info(tmp_path, "--revision", COMMIT)
    info["reprotrain"] = "0.0.0-another"  # a package installed over the image's own
    (tmp_path / "build-info.json").write_text(json.dumps(info))
    assert build_info_commit(tmp_path / "build-info.json") == (None, None)

    assert build_info_commit(tmp_path / "missing.json") == (None, None)
    (tmp_path / "broken.json").write_text("{")
    assert build_info_commit(tmp_path / "broken.json") == (None, None)


@pytest.mark.parametrize(
    ("remote", "label"),
    [
        ("https://github.com/example/reprotrain.git", "https://github.com/example/reprotrain.git"),
        ("git@github.com:example/reprotrain.git", "https://github.com/example/reprotrain.git"),
        ("ssh://git@gitlab.example/ml/reprotrain", "https://gitlab.example/ml/reprotrain"),
        ("/srv/git/reprotrain.git", ""),  # a clone of a local clone: a path on the build host
        ("file:///srv/git/reprotrain.git", ""),
        ("https://builder:ghp_secret@github.com/example/reprotrain", ""),  # labels are public
        ("", ""),
    ],
)
def test_the_source_label_is_a_repository_url_or_left_out(remote: str, label: str) -> None:
    out = subprocess.run(
        ["bash", str(DOCKER / "source_url.sh"), remote],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == label


def test_the_dockerfile_sets_no_source_label_of_its_own() -> None:
    # build.sh adds it with --label only when source_url.sh prints a URL.
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "image.source" not in dockerfile.replace("# org.opencontainers.image.source", "")
    assert "org.opencontainers.image.source=$source_url" in (DOCKER / "build.sh").read_text()
