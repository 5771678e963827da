"""The spec: strict validation with field paths, and a hash that sees meaning, not spelling."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.errors import SpecError
from worker.spec import ExperimentSpec, parse_spec, parse_spec_text

BASE: dict[str, Any] = {
    "name": "blobs",
    "seed": 7,
    "dataset": {
        "generator": "gaussian_blobs",
        "params": {"num_features": 4, "spread": 0.5},
        "batch_size": 16,
        "train_batches": 6,
    },
    "model": {"architecture": "mlp", "params": {"hidden": [8], "dropout": 0.25}},
    "training": {
        "epochs": 3,
        "optimizer": {"name": "adam", "params": {"learning_rate": 0.001}},
        "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
        "metrics": ["accuracy"],
    },
}


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _respelled_json(value: Any, rng: random.Random) -> str:
    """JSON text of `value` with numbers written in other, equivalent spellings."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):
        return rng.choice([str(value), f"{value}.0", f"{value}e0", f"{value * 10}e-1"])
    if isinstance(value, float):
        return rng.choice([repr(value), f"{value:.17e}", f"{value:.17g}"])
    if isinstance(value, dict):
        body = ", ".join(f"{json.dumps(k)}: {_respelled_json(v, rng)}" for k, v in value.items())
        return "{" + body + "}"
    return "[" + ", ".join(_respelled_json(v, rng) for v in value) + "]"


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_key_order_and_number_spelling_do_not_change_the_hash(rng: random.Random) -> None:
    reference = parse_spec(BASE).spec_hash()
    text = _respelled_json(_shuffled(BASE, rng), rng)
    assert parse_spec_text(text, fmt="json").spec_hash() == reference


def _leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaf_paths(v, (*prefix, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaf_paths(v, (*prefix, i))]
    return [prefix]


def _changed(path: tuple[Any, ...], value: Any) -> Any:
    """A different value of the same kind, valid wherever the original was."""
    if value is None:
        # A stored dataset, code bundle or model definition.
        if path in (("dataset", "data"), ("code",), ("model", "definition")):
            return "sha256:" + "ab" * 32
        if path == ("determinism", "tf32"):
            return False
        if path == ("environment", "hardware"):
            return "gpu:nvidia-h100-80gb-hbm3"
        return "registry.example/img:1" if path == ("environment", "image") else 2
    if value == "autotune":
        return 3
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5
    return value + "x"


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_any_field_change_changes_the_hash(data: st.DataObject) -> None:
    spec = parse_spec(BASE)
    full = spec.model_dump(mode="json")
    # The version has a single accepted value today; every other leaf may change.
    paths = [p for p in _leaf_paths(full) if p != ("version",)]
    path = data.draw(st.sampled_from(paths))
    mutated = copy.deepcopy(full)
    target = mutated
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _changed(path, target[path[-1]])
    if path == ("distribution", "hosts"):  # two hosts need an even count of row shards
        full["dataset"]["shards"] = mutated["dataset"]["shards"] = 2
        spec = parse_spec(full)
    assert parse_spec(mutated).spec_hash() != spec.spec_hash(), path


def test_free_form_params_change_the_hash() -> None:
    other = copy.deepcopy(BASE)
    other["dataset"]["params"]["spread"] = 0.5000001
    assert parse_spec(other).spec_hash() != parse_spec(BASE).spec_hash()


def test_defaults_written_out_hash_like_defaults_left_out() -> None:
    explicit = copy.deepcopy(BASE)
    explicit["determinism"] = {"op_determinism": True, "python_hash_seed": 0}
    explicit["dataset"]["num_parallel_calls"] = "autotune"
    assert parse_spec(explicit).spec_hash() == parse_spec(BASE).spec_hash()


def test_fields_added_later_keep_older_hashes_while_at_their_defaults() -> None:
    explicit = copy.deepcopy(BASE)
    explicit["distribution"] = {"replicas": 1, "hosts": 1}
    explicit["dataset"]["data"] = None
    explicit["training"]["checkpoint_every_steps"] = None
    explicit["model"]["definition"] = None
    canonical = parse_spec(explicit).canonical_json()
    assert "distribution" not in canonical and "checkpoint_every_steps" not in canonical
    assert '"data"' not in canonical and '"definition"' not in canonical
    assert parse_spec(explicit).spec_hash() == parse_spec(BASE).spec_hash()
    two = copy.deepcopy(BASE)
    two["distribution"] = {"replicas": 2}
    assert '"distribution":{"replicas":2}' in parse_spec(two).canonical_json()


def test_bad_replicas_and_dataset_digests_are_refused() -> None:
    for distribution in ({"replicas": 0}, {"replicas": 65}, {"replicas": "2"}):
        with pytest.raises(SpecError, match=r"distribution\.replicas"):
            parse_spec(dict(BASE, distribution=distribution))
    bad = copy.deepcopy(BASE)
    bad["dataset"]["data"] = "md5:abc"
    with pytest.raises(SpecError, match=r"dataset\.data"):
        parse_spec(bad)


def test_int_seed_is_the_pair_with_zero() -> None:
    pair = dict(BASE, seed=[7, 0])
    assert parse_spec(pair).spec_hash() == parse_spec(BASE).spec_hash()
    assert parse_spec(BASE).seed == (7, 0)


def test_yaml_and_json_of_one_spec_hash_equal() -> None:
    yaml_text = """
name: blobs
seed: 7
dataset:
  generator: gaussian_blobs
  params: {spread: 5e-1, num_features: 4}
  batch_size: 16
  train_batches: 6
model: {architecture: mlp, params: {hidden: [8], dropout: 0.25}}
training:
  epochs: 3
  optimizer: {name: adam, params: {learning_rate: 1e-3}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
  metrics: [accuracy]
"""
    assert parse_spec_text(yaml_text).spec_hash() == parse_spec(BASE).spec_hash()


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"dataset": {**BASE["dataset"], "batch_size": 0}}, "dataset.batch_size"),
        ({"dataset": {**BASE["dataset"], "shuffle": True}}, "dataset.shuffle"),
        ({"training": {**BASE["training"], "epochs": 2.5}}, "training.epochs"),
        ({"training": {**BASE["training"], "epochs": True}}, "training.epochs"),
        ({"seed": "42"}, "seed"),
        ({"seed": [1, 2, 3]}, "seed"),
        ({"seed": -1}, "seed"),
        ({"dataset": {**BASE["dataset"], "params": {"x": float("nan")}}}, "dataset.params"),
        ({"version": 2}, "version"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_specs_name_the_field(patch: dict[str, Any], loc: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({**BASE, **patch})
    assert loc in [e["loc"] for e in info.value.errors]
    assert loc in str(info.value)


def test_missing_required_section_is_reported() -> None:
    data = {k: v for k, v in BASE.items() if k != "model"}
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert info.value.errors == [{"loc": "model", "msg": "Field required"}]


@pytest.mark.parametrize("text", ["name: [", "{'a': ", "- just\n- a list\n"])
def test_malformed_or_non_mapping_text_is_a_spec_error(text: str) -> None:
    with pytest.raises(SpecError):
        parse_spec_text(text)


def test_with_seed_fixes_a_null_seed_and_changes_the_hash() -> None:
    spec = parse_spec(dict(BASE, seed=None))
    fixed = spec.with_seed((5, 6))
    assert fixed.seed == (5, 6)
    assert fixed.spec_hash() != spec.spec_hash()
    assert isinstance(ExperimentSpec.model_validate_json(fixed.canonical_json()), ExperimentSpec)


def test_every_example_spec_is_valid() -> None:
    from pathlib import Path

    from worker.models.registry import check_spec
    from worker.spec import load_spec

    folder = Path(__file__).resolve().parents[2] / "examples"
    examples = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".json"))
    assert len(examples) >= 4
    for path in examples:
        check_spec(load_spec(path))


def test_yaml_aliases_are_refused() -> None:
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nname: *c\n"
    with pytest.raises(SpecError, match="aliases are not allowed"):
        parse_spec_text(bomb)
