"""The installed-packages digest in every job's provenance: read from the metadata headers
alone, it equals the digest of each distribution's fully parsed metadata, as before."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from worker.record.provenance import _name_and_version, package_set_digest


def _parsed_whole() -> dict[str, object]:
    return package_set_digest(
        packages=(
            (dist.metadata["Name"], dist.version)
            for dist in importlib.metadata.distributions()
            if dist.metadata["Name"]
        )
    )


def test_the_installed_packages_digest_is_what_parsing_every_metadata_file_gives() -> None:
    assert package_set_digest() == _parsed_whole()
    assert package_set_digest()["count"] > 10


def test_names_and_versions_come_from_the_headers_only(tmp_path: Path) -> None:
    plain = tmp_path / "plain-1.0.dist-info"
    plain.mkdir()
    (plain / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Plain_Pkg \nVersion: 1.0\n\nName: not-this\nVersion: 9\n"
    )
    dist = importlib.metadata.PathDistribution(plain)
    assert _name_and_version(dist) == ("Plain_Pkg ", "1.0") == (dist.metadata["Name"], dist.version)
    # Headers the quick read cannot find, or folded over lines, are left to the full parser.
    for name, text in [
        ("odd", "Metadata-Version: 2.1\nName: odd\n"),
        ("folded", "Name: folded\n  more\nVersion: 2\n"),
    ]:
        path = tmp_path / f"{name}.dist-info"
        path.mkdir()
        (path / "METADATA").write_text(text)
        dist = importlib.metadata.PathDistribution(path)
        assert _name_and_version(dist) == (dist.metadata["Name"], dist.version)
