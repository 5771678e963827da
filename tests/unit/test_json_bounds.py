"""Bounds on free-form JSON, and the API's strict JSON reading."""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, ValidationError

from service.api.routing import parse_json
from service.json_bounds import (
    DETAILS,
    PROGRESS,
    JsonBounds,
    bounded_extras,
    bounded_json,
    exceeds_int_digits,
    json_problem,
)
from service.worker_schemas import CompleteIn, FailIn, HeartbeatIn

SMALL = JsonBounds(max_depth=3, max_values=10, max_bytes=100)


def _nested(depth: int) -> Any:
    doc: Any = 1
    for _ in range(depth):
        doc = {"a": doc}
    return doc


def test_a_document_within_every_bound_passes() -> None:
    assert json_problem({"a": [1, 2, {"b": None}]}, SMALL) is None
    assert json_problem(_nested(3), SMALL) is None
    assert json_problem({}, SMALL) is None and json_problem("text", SMALL) is None


def test_depth_counts_containers_and_the_problem_names_the_path() -> None:
    assert json_problem(_nested(4), SMALL) == "nests deeper than 3 levels at a.a.a"
    assert json_problem([[[[1]]]], SMALL) == "nests deeper than 3 levels at 0.0.0"


def test_keys_and_values_are_counted_together() -> None:
    assert json_problem({f"k{i}": i for i in range(5)}, SMALL) is None  # 10 = 5 keys + 5
    assert json_problem({f"k{i}": i for i in range(6)}, SMALL) == (
        "has more than 10 keys and values"
    )
    assert json_problem(list(range(11)), SMALL) == "has more than 10 keys and values"


def test_size_is_the_compact_json_encoding() -> None:
    fits = {"t": "x" * 92}  # {"t":"..."} is 8 bytes around the text
    assert len(json.dumps(fits, separators=(",", ":"))) == 100
    assert json_problem(fits, SMALL) is None
    assert json_problem({"t": "x" * 93}, SMALL) == "is 101 bytes of JSON, more than 100"


def test_a_document_nested_far_past_the_stack_is_judged_without_recursion() -> None:
    doc: Any = 1
    for _ in range(100_000):
        doc = [doc]
    assert json_problem(doc, PROGRESS) is not None


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")

    data: Annotated[dict[str, Any], bounded_json(SMALL)]


def test_a_bounded_field_is_a_validation_error_at_its_path() -> None:
    with pytest.raises(ValidationError) as caught:
        _Model.model_validate({"data": _nested(5)})
    [error] = caught.value.errors()
    assert error["loc"] == ("data",)
    assert "nests deeper than 3 levels" in error["msg"]


def test_bounded_extras_bound_the_undeclared_fields_together() -> None:
    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")

    Checked = Annotated[Loose, bounded_extras(SMALL)]

    class Outer(BaseModel):
        inner: Checked

    Outer.model_validate({"inner": {"x": 1, "y": [1, 2]}})
    with pytest.raises(ValidationError, match="extra fields: nests deeper"):
        Outer.model_validate({"inner": {"x": _nested(4)}})


def test_worker_reports_are_bounded_at_the_schema() -> None:
    HeartbeatIn.model_validate({"worker_id": 1, "progress": {"epoch": 2, "loss": 0.5}})
    with pytest.raises(ValidationError, match="nests deeper than 8 levels"):
        HeartbeatIn.model_validate({"worker_id": 1, "progress": _nested(9)})
    with pytest.raises(ValidationError, match="extra fields"):
        FailIn.model_validate(
            {"worker_id": 1, "error": {"type": "E", "message": "m", "more": _nested(17)}}
        )
    wide = {f"k{i}": "v" for i in range(DETAILS.max_values)}
    with pytest.raises(ValidationError, match="keys and values"):
        FailIn.model_validate({"worker_id": 1, "error": {"type": "E", "message": "m", "w": wide}})
    for field in ("provenance", "determinism", "spec"):
        with pytest.raises(ValidationError, match=f"{field} nests deeper than 16"):
            CompleteIn.model_validate(
                {"worker_id": 1, "result": {"status": "succeeded", field: _nested(17)}}
            )
    with pytest.raises(ValidationError, match="metrics nests deeper than 16"):
        CompleteIn.model_validate(
            {"worker_id": 1, "result": {"status": "succeeded", "metrics": [_nested(16)]}}
        )
    # Long but shallow is fine: 10,000 epochs of metrics.
    metrics = [{"epoch": e, "loss": 0.1, "accuracy": 0.9} for e in range(10_000)]
    CompleteIn.model_validate(
        {"worker_id": 1, "result": {"status": "succeeded", "metrics": metrics}}
    )


def test_json_bodies_refuse_nan_huge_numbers_and_runaway_nesting() -> None:
    assert parse_json(b'{"a": [1, 2.5, "x", null]}') == {"a": [1, 2.5, "x", None]}
    assert parse_json("-" + "9" * 4300) == -int("9" * 4300)
    for text in ("NaN", '{"a": Infinity}', "[" * 100_000 + "]" * 100_000):
        with pytest.raises(json.JSONDecodeError):
            parse_json(text)
    for text in ("1" * 4301, "1e999", "-1e400"):
        with pytest.raises(HTTPException) as caught:
            parse_json(text)
        assert caught.value.status_code == 422


def test_the_int_digit_limit_is_recognised_both_ways() -> None:
    with pytest.raises(ValueError) as parsing:
        int("1" * 5000)
    assert exceeds_int_digits(parsing.value)
    with pytest.raises(ValueError) as printing:
        str(16**5000)
    assert exceeds_int_digits(printing.value)
    assert not exceeds_int_digits(ValueError("invalid literal for int() with base 10: 'x'"))
