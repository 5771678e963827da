"""Where two experiment specs differ, field by field (TensorFlow-free, for comparison reports).

Runs of different specs (another replica count, XLA, thread settings, seed...) are still
compared at the trace points they share; the report lists these differences so a reader
knows what changed on purpose before reading how much the weights moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_SHOWN = 3
_MISSING = object()
# Fields whose change is known to leave the trained values alone only if nothing else in
# the computation depends on them; the explanation names them, nothing is assumed.
_WHY: dict[str, str] = {
    "distribution.replicas": "the gradient is reduced across replicas in another order",
    "dataset.xla": "XLA fuses and reorders the data generator's floating-point operations",
    "determinism.intra_op_threads": "ops split their work into other partial sums",
    "determinism.inter_op_threads": "independent ops are scheduled differently",
    "determinism.tf32": "TF32 rounds float32 matmul and convolution inputs to 10 mantissa bits",
    "training.steps_per_execution": "the steps run in a compiled loop, whose body TensorFlow "
    "may optimise differently from a single step's",
    "dataset.num_parallel_calls": "only the scheduling of batch generation changes",
    "seed": "another seed draws other initial weights and data",
}


def script_arguments(args: Sequence[Any]) -> dict[str, Any]:
    """A script's command line by argument: `--lr 0.01` and `--lr=0.01` as {"--lr": "0.01"},
    a flag alone as True, anything else by position ("#0", ...), so a diff names what
    changed rather than a whole list."""
    named: dict[str, Any] = {}
    items = [str(a) for a in args]
    i = 0
    while i < len(items):
        item = items[i]
        if item.startswith("-") and len(item) > 1 and not _number(item):
            name, eq, value = item.partition("=")
            if eq:
                named[name] = value
            elif i + 1 < len(items) and (not items[i + 1].startswith("-") or _number(items[i + 1])):
                named[name] = items[i + 1]
                i += 1
            else:
                named[name] = True
        else:
            named[f"#{i}"] = item
        i += 1
    return named


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def flatten_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Every leaf field of a spec by its dotted path (`training.optimizer.params.lr`); a list
    (a seed pair, hidden sizes) is one value, a script's arguments one field each."""
    out: dict[str, Any] = {}
    _flatten(spec, "", out)
    return out


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if path == "script.args" and isinstance(value, list):
        value = script_arguments(value) or value
    if isinstance(value, Mapping) and value:
        for key in sorted(value, key=str):
            _flatten(value[key], f"{path}.{key}" if path else str(key), out)
    else:
        out[path] = value  # lists (a seed pair, hidden sizes) are one value


def diff_specs(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """[{"path", "a", "b"}] for every leaf field whose value differs (None where absent),
    in path order; [] when either spec is unknown."""
    if a is None or b is None:
        return []
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(a, "", flat_a)
    _flatten(b, "", flat_b)
    rows = []
    for path in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(path, _MISSING), flat_b.get(path, _MISSING)
        if va != vb or type(va) is not type(vb):
            rows.append(
                {
                    "path": path,
                    "a": None if va is _MISSING else va,
                    "b": None if vb is _MISSING else vb,
                }
            )
    return rows


def describe_spec_diff(diff: Sequence[Mapping[str, Any]]) -> str:
    """A sentence naming the differing fields with both values (the first few)."""
    shown = ", ".join(f"{d['path']} ({d['a']} vs {d['b']})" for d in diff[:_SHOWN])
    more = len(diff) - _SHOWN
    return f"The specs differ in {shown}{f' and {more} more fields' if more > 0 else ''}."


def why_it_matters(diff: Sequence[Mapping[str, Any]]) -> str | None:
    """What a known differing field changes in the computation, if one is known."""
    for d in diff:
        if d["path"] in _WHY:
            return f"{d['path']}: {_WHY[d['path']]}"
    return None


# Provenance fields a job records from its spec and its data rather than from the machine:
# another value means other training input or another computation, so a difference changes
# results whatever the environment (first match wins; a prefix ending in "." covers a section).
_FROM_SPEC: tuple[tuple[str, str], ...] = (
    ("dataset.digest", "another dataset: the rows training reads may differ"),
    ("dataset.", "another dataset: its arrays differ"),
    ("model_definition.", "another model definition: its layers differ"),
    ("code.", "another code bundle: the training code differs"),
    ("seed", "another seed draws other initial weights and data"),
    ("seed.", "another seed draws other initial weights and data"),
    ("spec_hash", "another spec: the data or the computation may differ"),
)


def _from_spec(field: str) -> str | None:
    for prefix, why in _FROM_SPEC:
        if field == prefix or (prefix.endswith(".") and field.startswith(prefix)):
            return why
    return None


def classify_provenance(diff: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The provenance diff with the fields recorded from the spec or the data (dataset
    digest and arrays, seed, spec hash) flagged as changing results, those first."""
    rows = []
    for d in diff:
        why = _from_spec(str(d["field"]))
        rows.append({**d, "breaks_reproducibility": True, "why": why} if why else dict(d))
    return sorted(rows, key=lambda e: (not e["breaks_reproducibility"], e["field"]))


def is_from_spec(field: str) -> bool:
    """Whether a provenance field is recorded from the spec or the data, not the machine."""
    return _from_spec(field) is not None
