"""Which layers differ between the Keras model definitions two runs trained (TF-free).

A run trained on a stored definition records, in its provenance, the definition's digest
and each layer's class and config digest (`model_definition`). Two runs on different
definitions trained different models, whatever their bits say: the comparison lists the
layers added, removed or configured differently, and flags the difference as changing
results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SHOWN = 8  # layers named in the explanation; the report lists them all


def _definition(provenance: Mapping[str, Any]) -> Mapping[str, Any] | None:
    found = provenance.get("model_definition")
    return found if isinstance(found, Mapping) and found.get("digest") else None


def _layers(definition: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    layers = definition.get("layers")
    return dict(layers) if isinstance(layers, Mapping) else {}


def layers_differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Layers whose config differs between the runs' definitions (from their provenance):
    `{"layer", "change": "changed" | "added" | "removed", "class_a", "class_b"}`; empty when
    either run trained no definition or both trained the same one."""
    da, db = _definition(a), _definition(b)
    if da is None or db is None or da["digest"] == db["digest"]:
        return []
    la, lb = _layers(da), _layers(db)
    rows = []
    for path in sorted(set(la) | set(lb), key=lambda p: (p not in la, p)):
        x, y = la.get(path), lb.get(path)
        if x is not None and y is not None and x.get("config_sha256") == y.get("config_sha256"):
            continue
        change = "removed" if y is None else "added" if x is None else "changed"
        rows.append(
            {
                "layer": path,
                "change": change,
                "class_a": None if x is None else x.get("class_name"),
                "class_b": None if y is None else y.get("class_name"),
            }
        )
    return rows


def model_sentence(a: Mapping[str, Any], b: Mapping[str, Any], rows: list[dict[str, Any]]) -> str:
    """The explanation's sentence on differing definitions (the runs' provenance and rows)."""
    da, db = _definition(a), _definition(b)
    assert da is not None and db is not None
    shown = ", ".join(
        f"{r['layer']} ({r['class_b'] or r['class_a']}, {r['change']})" for r in rows[:_SHOWN]
    )
    more = f" and {len(rows) - _SHOWN} more" if len(rows) > _SHOWN else ""
    which = f"the layers whose config differs: {shown}{more}" if rows else "no layer's config"
    return (
        f"The runs trained different model definitions ({da['digest']} vs {db['digest']}), "
        f"which changes results; {which}."
    )


def add_model_diff(
    report: dict[str, Any], a: Mapping[str, Any], b: Mapping[str, Any]
) -> dict[str, Any]:
    """The report with `model_layers_differing` and, when the definitions differ, a sentence
    saying which layers at the front of its explanation."""
    rows = layers_differing(a, b)
    report["model_layers_differing"] = rows
    da, db = _definition(a), _definition(b)
    if da is not None and db is not None and da["digest"] != db["digest"]:
        report["explanation"] = f"{model_sentence(a, b, rows)} {report.get('explanation', '')}"
    return report
