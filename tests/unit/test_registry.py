"""Registries: names resolve, unknown names list the known, plugins come from entry points."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.plugin_dist import PLUGIN_DIR, make_plugin_site
from tests.unit.test_spec import BASE
from worker.errors import SpecError, UnknownComponentError
from worker.models import registry
from worker.spec import parse_spec


@pytest.fixture
def plugins(tmp_path: Path) -> Iterator[None]:
    site = make_plugin_site(tmp_path)
    sys.path[:0] = [str(site), str(PLUGIN_DIR)]
    registry.components.cache_clear()
    try:
        yield
    finally:
        sys.path.remove(str(site))
        sys.path.remove(str(PLUGIN_DIR))
        registry.components.cache_clear()


def _spec(**sections: Any) -> Any:
    return parse_spec({**BASE, **sections})


def test_builtins_are_registered() -> None:
    assert {"gaussian_blobs", "regression", "pattern_images", "token_sequences"} <= set(
        registry.components("generator")
    )
    assert {"mlp", "small_cnn", "tiny_transformer", "gru"} <= set(
        registry.components("architecture")
    )
    registry.check_spec(_spec())


def test_unknown_generator_lists_the_known_names() -> None:
    spec = _spec(dataset={**BASE["dataset"], "generator": "mnist"})
    with pytest.raises(UnknownComponentError) as info:
        registry.check_spec(spec)
    assert info.value.errors[0]["loc"] == "dataset.generator"
    assert "'mnist'" in str(info.value)
    assert "gaussian_blobs" in str(info.value) and "token_sequences" in str(info.value)


@pytest.mark.parametrize(
    ("section", "patch", "loc"),
    [
        ("model", {"architecture": "resnet"}, "model.architecture"),
        ("training", {"optimizer": {"name": "adamax2"}}, "training.optimizer.name"),
        ("training", {"loss": {"name": "hinge2"}}, "training.loss.name"),
        ("training", {"metrics": ["accuracy", "f1"]}, "training.metrics.1"),
    ],
)
def test_every_named_component_is_checked(section: str, patch: dict[str, Any], loc: str) -> None:
    spec = _spec(**{section: {**BASE[section], **patch}})
    with pytest.raises(UnknownComponentError) as info:
        registry.check_spec(spec)
    assert info.value.errors[0]["loc"] == loc
    assert "known:" in str(info.value)


def test_builtin_params_are_validated_with_their_path() -> None:
    spec = _spec(model={"architecture": "mlp", "params": {"hidden": [8], "dropuot": 0.1}})
    with pytest.raises(SpecError) as info:
        registry.check_spec(spec)
    assert info.value.errors[0]["loc"] == "model.params.dropuot"
    spec = _spec(dataset={**BASE["dataset"], "params": {"num_classes": 1}})
    with pytest.raises(SpecError) as info:
        registry.check_spec(spec)
    assert info.value.errors[0]["loc"] == "dataset.params.num_classes"


def test_entry_point_plugins_are_discovered(plugins: None) -> None:
    gens = registry.components("generator")
    assert gens["stateful_noise"].source == "reprotrain-test-plugins"
    assert registry.components("architecture")["wide_mlp"].load().__name__ == "wide_mlp"
    spec = _spec(model={"architecture": "wide_mlp", "params": {"width": 4}})
    registry.check_spec(spec)


def test_a_plugin_cannot_shadow_a_builtin(plugins: None) -> None:
    assert registry.components("generator")["gaussian_blobs"].source == "builtin"


LOSS_DECLARED = [{"group": "reprotrain.losses", "name": "ring_loss", "value": "rb.loss:make"}]


def test_a_loss_is_known_only_with_the_bundle_that_declares_it() -> None:
    loss = {**BASE["training"], "loss": {"name": "ring_loss", "params": {"scale": 2.0}}}
    spec = _spec(training=loss)
    with registry.bundled_components(LOSS_DECLARED, "sha256:" + "ab" * 32):
        registry.check_spec(spec)  # known by name, never imported; the job checks its params
        # A bundle may not shadow a built-in loss: the built-in's params are still checked.
        builtin = {**BASE["training"], "loss": {"name": "mse", "params": {"scale": 2.0}}}
        with pytest.raises(SpecError) as bad:
            registry.check_spec(_spec(training=builtin))
        assert bad.value.errors[0]["loc"].startswith("training.loss.params")
    with pytest.raises(UnknownComponentError) as unknown:
        registry.check_spec(spec)
    assert unknown.value.errors[0]["loc"] == "training.loss.name"
    assert "ring_loss" in str(unknown.value) and "sparse_categorical_crossentropy" in str(
        unknown.value
    )
