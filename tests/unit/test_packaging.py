"""The installed packages: pyproject.toml lists them, so a new package folder must be listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_installed_and_the_client_under_its_own_name() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = find_namespace_packages(
        where=str(ROOT),
        include=["worker*", "service*", "migrations*"],
        exclude=["service.client", "service.client.*"],
    )
    assert sorted(config["packages"]) == sorted([*found, "reprotrain"])
    assert config["package-dir"] == {"reprotrain": "service/client"}
