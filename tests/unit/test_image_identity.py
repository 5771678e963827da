"""The image identity an agent is told (REPRO_IMAGE_ID, REPRO_IMAGE_DIGEST) must be one: a
placeholder or a tag would be recorded as provenance and pin reruns to nothing real."""

from __future__ import annotations

import pytest

from worker.node.executors.process import ImageIdentityRefused, told_images

IMAGE_ID = "sha256:" + "5" * 64
DIGEST = "registry.example.com/reprotrain/reprotrain-worker-gpu@sha256:" + "3" * 64


def test_well_formed_identities_are_advertised_in_order() -> None:
    both = {"REPRO_IMAGE_ID": IMAGE_ID, "REPRO_IMAGE_DIGEST": DIGEST}
    assert told_images(both) == [IMAGE_ID, DIGEST]
    assert told_images({"REPRO_IMAGE_DIGEST": "registry:5000/w:1.0@sha256:" + "a" * 64})
    assert told_images({}) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REPRO_IMAGE_ID", "unset"),
        ("REPRO_IMAGE_ID", "sha256:" + "5" * 63),
        ("REPRO_IMAGE_DIGEST", "registry.example.com/reprotrain/worker:0.1.0"),
        ("REPRO_IMAGE_DIGEST", "sha256:" + "3" * 64),
    ],
)
def test_a_placeholder_or_a_tag_is_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ImageIdentityRefused, match=f"{name}=") as refused:
        told_images({name: value})
    assert "pin-image.sh" in str(refused.value)
