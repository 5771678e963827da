"""The comparison report of two runs: identical, or where, in what, how much and why not.

TensorFlow-free (NumPy for the numeric differences): the API builds reports with it from
its database and artifact store, and `repro compare` from two result documents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from worker.compare.code_diff import add_code_diff
from worker.compare.model_diff import add_model_diff
from worker.compare.numeric_diff import array_difference
from worker.compare.spec_diff import (
    classify_provenance,
    describe_spec_diff,
    diff_specs,
    is_from_spec,
    why_it_matters,
)
from worker.errors import CheckpointError, CheckpointRefused
from worker.record.checkpoint import checkpoint_epoch, read_variables
from worker.record.environment_capture import unlisted_variables
from worker.record.provenance import diff_provenance
from worker.record.trace import Located, TracePoint, diff_variables, locate_divergence
from worker.result import JobResult

# (epoch, variable paths) -> {path: array}, from the run's checkpoint at the end of that epoch.
CheckpointReader = Callable[[int, Sequence[str]], Mapping[str, np.ndarray]]
_SHOWN_VARIABLES = 5
_SHOWN_FIELDS = 3


@dataclass
class RunRecord:
    """What the report needs to know about one run, wherever it is stored."""

    label: str  # "run 12", or a file name
    status: str
    spec_hash: str | None
    granularity: str | None
    final_fingerprint: str | None
    trace: Sequence[TracePoint | Mapping[str, Any]]
    data: Mapping[int, str] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    warnings: Sequence[str] = ()
    # Per-variable digests of a point, when `trace` was loaded without them.
    variables_at: Callable[[TracePoint], Mapping[str, str]] | None = None
    checkpoint_epochs: Sequence[int] = ()
    read_checkpoint: CheckpointReader | None = None
    # The resolved spec: runs of different specs are compared with their spec diff.
    spec: Mapping[str, Any] | None = None
    # The fingerprint of the evaluation batches (None: not evaluated, or not known).
    eval_data: str | None = None


def _moment(p: TracePoint) -> dict[str, Any]:
    return {"kind": p.kind, "epoch": p.epoch, "step": p.step, "label": p.label()}


def layer_of(path: str) -> str:
    """The layer (or optimizer slot group) a variable path belongs to: all but its last part."""
    return path.rsplit("/", 1)[0] if "/" in path else path


def _incomparable(
    reason: str, a: RunRecord, b: RunRecord, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    report: dict[str, Any] = {"verdict": "incomparable", "reason": reason, **(extra or {})}
    report["provenance_diff"] = classify_provenance(diff_provenance(a.provenance, b.provenance))
    report["explanation"] = f"The runs cannot be compared: {reason}."
    if report.get("spec_diff"):
        report["explanation"] += " " + describe_spec_diff(report["spec_diff"])
    return report


def _incomparable_reason(a: RunRecord, b: RunRecord) -> str | None:
    for r in (a, b):
        if r.status != "succeeded":
            return f"{r.label} did not succeed (status {r.status})"
    if a.spec_hash != b.spec_hash:
        if a.spec is None or b.spec is None:  # nothing to diff: nothing to say what changed
            return f"the runs have different specs ({a.spec_hash} vs {b.spec_hash})"
        return None  # compared at the trace points both recorded, with the spec diff
    if a.granularity != b.granularity:
        return f"their traces have different granularity ({a.granularity} vs {b.granularity})"
    return None


def _different_models(a: RunRecord, b: RunRecord, located: Located) -> str | None:
    """Why runs of different specs train different models, if they do: their first common
    trace point names other variables (not merely other shapes). Such runs are unrelated
    experiments, not a divergence. None when they share every name, or a trace point
    carries no variable names to tell. Runs of one spec never read any."""
    if a.spec_hash == b.spec_hash or not located.common:
        return None
    pa, pb = located.common[0]
    names_a, names_b = set(_variables(a, pa)), set(_variables(b, pb))
    if not names_a or not names_b or names_a == names_b:
        return None
    only_a, only_b = len(names_a - names_b), len(names_b - names_a)
    return (
        f"they train different models ({only_a} variable{'s' if only_a != 1 else ''} only in "
        f"{a.label}, {only_b} only in {b.label}, {len(names_a & names_b)} in both)"
    )


def _variables(record: RunRecord, point: TracePoint) -> Mapping[str, str]:
    return record.variables_at(point) if record.variables_at is not None else point.variables


def _measure(
    a: RunRecord, b: RunRecord, point: TracePoint, paths: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """Numeric size of each differing variable, from the first checkpoint at or after `point`."""
    if not paths:
        return [], None, None
    both = sorted(set(a.checkpoint_epochs) & set(b.checkpoint_epochs))
    epoch = next((e for e in both if e >= point.epoch), None)
    if epoch is None or a.read_checkpoint is None or b.read_checkpoint is None:
        return [], None, f"no checkpoint of both runs at or after the {point.label()}"
    try:
        values_a, values_b = a.read_checkpoint(epoch, paths), b.read_checkpoint(epoch, paths)
    except CheckpointRefused:
        raise  # a hostile checkpoint is the caller's to answer, not a footnote of the report
    except (CheckpointError, OSError, ValueError, KeyError) as exc:
        return [], None, f"the checkpoints of epoch {epoch} could not be read: {exc}"
    exact = point.kind == "epoch" and point.epoch == epoch
    where = {"epoch": epoch, "label": f"end of epoch {epoch}", "at_divergence": exact}
    rows = []
    for path in paths:
        if path not in values_a or path not in values_b:
            missing = "not in both checkpoints"
            rows.append({"variable": path, "layer": layer_of(path), "note": missing})
            continue
        diff = array_difference(values_a[path], values_b[path])
        rows.append({"variable": path, "layer": layer_of(path), **diff})
    note = None if exact else f"measured at the end of epoch {epoch}, the first checkpoint after"
    return rows, where, note


def _seed_differs(spec_diff: Sequence[Mapping[str, Any]]) -> bool:
    return any(d["path"] == "seed" or d["path"].startswith("seed.") for d in spec_diff)


def _cause(
    point: TracePoint, a: RunRecord, b: RunRecord, spec_diff: Sequence[Mapping[str, Any]]
) -> tuple[str, dict[str, Any]]:
    """('seed' | 'data' | 'compute' | 'unknown', the data fingerprints of the divergent
    epoch). Another seed draws other initial weights and other batches: it is the cause
    wherever the runs first differ, and the data are never called equal for it."""
    if point.kind == "init":
        data: dict[str, Any] = {"epoch": 0, "a": None, "b": None, "equal": None}
        return ("seed" if _seed_differs(spec_diff) else "compute"), data
    fa, fb = a.data.get(point.epoch), b.data.get(point.epoch)
    data = {"epoch": point.epoch, "a": fa, "b": fb, "equal": None if not fa or not fb else fa == fb}
    if _seed_differs(spec_diff):
        return "seed", data
    if data["equal"] is None:
        return "unknown", data
    return ("compute" if data["equal"] else "data"), data


def verdict_of(a: RunRecord, b: RunRecord) -> tuple[str, str]:
    """The verdict `build_report` gives, with a short reason, from statuses, specs, trace
    fingerprints and final fingerprints; runs of different specs also have the variable
    names of their first common trace point read (no checkpoint is)."""
    reason = _incomparable_reason(a, b)
    if reason is not None:
        return "incomparable", reason
    located = locate_divergence(a.trace, b.trace)
    if not located.common:
        return "incomparable", "the runs have no trace point in common"
    unrelated = _different_models(a, b, located)
    if unrelated is not None:
        return "incomparable", unrelated
    if located.first is not None:
        return "diverged", f"diverged at {located.common[located.first][0].label()}"
    if (
        not located.unmatched_a
        and not located.unmatched_b
        and a.final_fingerprint is not None
        and a.final_fingerprint == b.final_fingerprint
    ):
        return "identical", str(a.final_fingerprint)
    if located.unmatched_a or located.unmatched_b:
        return "incomparable", "the runs recorded different trace points"
    return "incomparable", "the final fingerprints differ"


def build_report(a: RunRecord, b: RunRecord) -> dict[str, Any]:
    """The full comparison report of run b against run a (see docs: "Comparing runs")."""
    report = add_code_diff(_build_report(a, b), a.provenance, b.provenance)
    return add_model_diff(report, a.provenance, b.provenance)


def _build_report(a: RunRecord, b: RunRecord) -> dict[str, Any]:
    reason = _incomparable_reason(a, b)
    if reason is not None:
        return _incomparable(reason, a, b)
    # Specs that differ (another replica count, XLA, threads...) are compared all the same,
    # at the moments both traces recorded; the report says what differs in the specs.
    across = a.spec_hash != b.spec_hash
    spec_diff = diff_specs(a.spec, b.spec) if across else []
    located = locate_divergence(a.trace, b.trace)
    if not located.common:
        extra = {"spec_diff": spec_diff}
        return _incomparable("the runs have no trace point in common", a, b, extra)
    unrelated = _different_models(a, b, located)
    if unrelated is not None:
        return _incomparable(unrelated, a, b, {"spec_diff": spec_diff})
    provenance = classify_provenance(diff_provenance(a.provenance, b.provenance))
    shared_data = [e for e in a.data if e in b.data] if across else list(a.data)
    differing_data = sorted(e for e in shared_data if b.data.get(e) != a.data[e])
    base = {
        "points": len(located.common),
        "points_inspected": located.inspected,
        "provenance_diff": provenance,
        "data_epochs_differing": differing_data,
        "data_epochs_equal": sorted(e for e in shared_data if b.data.get(e) == a.data[e]),
        "spec_diff": spec_diff,
    }
    if (
        located.first is None
        and not located.unmatched_a
        and not located.unmatched_b
        and a.final_fingerprint is not None
        and a.final_fingerprint == b.final_fingerprint
    ):
        report = {"verdict": "identical", "fingerprint": a.final_fingerprint, **base}
        datasets = _dataset_sentence(a, b, report)
        explanation = _explain_identical(report, located)
        report["explanation"] = f"{explanation} {datasets}" if datasets else explanation
        return report
    if located.first is None:
        reason = (
            "the runs recorded different trace points"
            if located.unmatched_a or located.unmatched_b
            else "the final fingerprints differ"
        )
        if across:
            reason = f"they agree at all {len(located.common)} trace points both recorded, " + (
                reason.replace("the runs recorded", "but recorded")
                if located.unmatched_a or located.unmatched_b
                else "but their final fingerprints differ"
            )
            return _incomparable(reason, a, b, base)
        return _incomparable(reason, a, b)
    pa, pb = located.common[located.first]
    changed, only_a, only_b = diff_variables(_variables(a, pa), _variables(b, pb))
    layers: dict[str, list[str]] = {}
    for path in changed + only_a + only_b:
        layers.setdefault(layer_of(path), []).append(path)
    differences, measured_at, note = _measure(a, b, pa, changed)
    cause, data = _cause(pa, a, b, spec_diff)
    last = located.common[located.last_equal][0] if located.last_equal is not None else None
    report = {
        "verdict": "diverged",
        **base,
        "first_divergence": _moment(pa),
        "last_identical": _moment(last) if last is not None else None,
        "variables": changed + only_a + only_b,
        "variables_only_in": {"a": only_a, "b": only_b},
        "layers": layers,
        "differences": differences,
        "differences_measured_at": measured_at,
        "differences_note": note,
        "cause": cause,
        "data": data,
        "warnings": sorted({*a.warnings, *b.warnings}),
    }
    report["explanation"] = _explain_diverged(report)
    return report


# -- plain language ------------------------------------------------------------------------


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:.2g}"


def _size(d: Mapping[str, Any]) -> str:
    parts = []
    if d.get("max_abs_diff") is not None:
        parts.append(f"max |Δ| {_num(d['max_abs_diff'])}")
    if d.get("max_ulp") is not None:
        parts.append(f"{d['max_ulp']} ULP")
    return f" ({', '.join(parts)})" if parts else ""


def _spec_sentence(spec_diff: Sequence[Mapping[str, Any]]) -> str:
    why = why_it_matters(spec_diff)
    return f"{describe_spec_diff(spec_diff)} Differing specs are expected to train differently" + (
        f" ({why})." if why else "."
    )


def _environment_sentence(diff: Sequence[Mapping[str, Any]], cause: str | None) -> str:
    breaking = [d for d in diff if d["breaks_reproducibility"]]
    if breaking:
        shown = ", ".join(f"{d['field']} ({d['a']} vs {d['b']})" for d in breaking[:_SHOWN_FIELDS])
        more = len(breaking) - _SHOWN_FIELDS
        extra = f" and {more} more" if more > 0 else ""
        return f"The runs' environments differ in fields that can change results: {shown}{extra}."
    others = f" ({len(diff)} other fields differ, none known to affect numerics)" if diff else ""
    if cause == "data":
        hint = "such as a generator drawing from a stateful or unseeded RNG"
    else:
        hint = "such as an op without a deterministic kernel or unordered parallel work"
    unlisted = unlisted_variables(diff)
    if unlisted:
        names = ", ".join(unlisted[:_SHOWN_FIELDS]) + (
            " ..." if len(unlisted) > _SHOWN_FIELDS else ""
        )
        return (
            f"No recorded environment field known to affect numerics differs{others}, but "
            f"environment variables no list names do ({names}): if a library or plugin reads "
            f"one, it may be the cause; otherwise it is nondeterminism, {hint}."
        )
    return (
        f"No recorded environment field that affects numerics differs{others}, so the cause is "
        f"nondeterminism within the same environment, {hint}."
    )


def _explain_identical(report: Mapping[str, Any], located: Located) -> str:
    last = located.common[-1][0]
    text = (
        f"The runs are bitwise identical: all {report['points']} trace points through the "
        f"{last.label()} and the final fingerprint match."
    )
    if report.get("spec_diff"):
        spec = describe_spec_diff(report["spec_diff"])
        text = f"{spec} Even so, t{text[1:]}"
    # Fields recorded from the spec (dataset, seed, spec hash) are told by the spec diff,
    # when there is one.
    told = bool(report.get("spec_diff"))
    breaking = [
        d["field"]
        for d in report["provenance_diff"]
        if d["breaks_reproducibility"] and not (told and is_from_spec(d["field"]))
    ]
    if breaking:
        text += (
            f" Their environments differ in {', '.join(breaking[:_SHOWN_FIELDS])}"
            f"{' and more' if len(breaking) > _SHOWN_FIELDS else ''}, which did not change "
            "the result here."
        )
    return text


def dataset_digest(record: RunRecord) -> str | None:
    """The digest of the stored dataset a run trained on, from its provenance or its spec."""
    recorded = record.provenance.get("dataset")
    if isinstance(recorded, Mapping) and recorded.get("digest"):
        return str(recorded["digest"])
    named = (record.spec or {}).get("dataset")
    return str(named["data"]) if isinstance(named, Mapping) and named.get("data") else None


def _eval_batches(record: RunRecord) -> int | None:
    named = (record.spec or {}).get("dataset")
    value = named.get("eval_batches", 0) if isinstance(named, Mapping) else None
    return value if isinstance(value, int) else None


def _dataset_sentence(a: RunRecord, b: RunRecord, report: Mapping[str, Any]) -> str | None:
    """When the runs' datasets differ but every training batch was equal: the datasets
    differ only in rows training never read; and whether the evaluation stream differs."""
    digest_a, digest_b = dataset_digest(a), dataset_digest(b)
    if not digest_a or not digest_b or digest_a == digest_b:
        return None
    if report["data_epochs_differing"] or not report["data_epochs_equal"]:
        return None
    text = (
        f"The datasets differ ({digest_a} vs {digest_b}) only in rows training never read "
        f"(equal training data fingerprints in all {len(report['data_epochs_equal'])} epochs); "
    )
    if a.eval_data and b.eval_data:
        equal = a.eval_data == b.eval_data
        return text + f"the evaluation data {'is equal' if equal else 'differs'}."
    if _eval_batches(a) == 0 and _eval_batches(b) == 0:
        return text + "neither run evaluated, so those rows were never read at all."
    return text + "the evaluation data fingerprints were not recorded by both runs."


def _explain_diverged(r: Mapping[str, Any]) -> str:
    div, cause = r["first_divergence"], r["cause"]
    epoch = div["epoch"]
    sentences = []
    differing = r["data_epochs_differing"]
    if cause == "seed":
        seeds = next(d for d in r["spec_diff"] if d["path"].split(".")[0] == "seed")
        sentences.append(
            f"The runs were given different seeds ({seeds['a']} vs {seeds['b']}): another "
            "seed draws other initial weights and other batches, so they train differently"
            + (f"; the data of {_epochs(differing)} differ too." if differing else ".")
        )
    elif cause == "data":
        before = f"Data identical through epoch {epoch - 1}; the" if epoch > 1 else "The"
        sentences.append(
            f"{before} input pipeline diverged in epoch {epoch}: the runs' data fingerprints "
            f"for that epoch differ, so they trained on different batches."
        )
    elif cause == "compute" and epoch > 0:
        sentences.append(
            f"Data identical through epoch {epoch} (equal data fingerprints), so the "
            "computation diverged."
        )
    elif cause == "compute":
        sentences.append(
            "The initial weights already differ, before any data was used"
            + (f"; the data of {_epochs(differing)} differ as well." if differing else ".")
        )
    else:
        sentences.append(f"The data fingerprints of epoch {epoch} were not recorded by both runs.")
    names = r["variables"]
    first = r["differences"][0] if r["differences"] else None
    last = r["last_identical"]
    after = ""
    if last is not None:
        init = last["kind"] == "init"
        after = "identical at initialisation" if init else f"identical through the {last['label']}"
    if names:
        lead = names[0] + (_size(first) if first and first["variable"] == names[0] else "")
        rest = len(names) - 1
        others = (
            f" and {rest} other variable{'s' if rest > 1 else ''} in {len(r['layers'])} "
            f"layer{'s' if len(r['layers']) > 1 else ''}"
            if rest
            else ""
        )
        if last is None:
            sentences.append(f"Weights differ from the {div['label']} on, in {lead}{others}.")
        else:
            sentences.append(
                f"Weights are {after} and first differ at the {div['label']} in {lead}{others}."
            )
    else:
        sentences.append(f"The state first differs at the {div['label']}.")
    if r["differences_note"]:
        sentences.append(f"Sizes: {r['differences_note']}.")
    if r.get("spec_diff") and cause == "seed":
        unseeded = [d for d in r["spec_diff"] if d["path"].split(".")[0] != "seed"]
        if unseeded:
            sentences.insert(1, _spec_sentence(unseeded))
    elif r.get("spec_diff"):
        sentences.insert(0, _spec_sentence(r["spec_diff"]))
    else:
        sentences.append(_environment_sentence(r["provenance_diff"], cause))
    if r["warnings"]:
        sentences.append("The jobs warned: " + "; ".join(r["warnings"]) + ".")
    return " ".join(sentences)


def describe(report: Mapping[str, Any]) -> str:
    """One line for people: the verdict and, when diverged, where and in what."""
    fields = [d["path"] for d in report.get("spec_diff") or []]
    specs = f" (specs differ: {', '.join(fields[:_SHOWN_FIELDS])}" if fields else ""
    specs += (" and more)" if len(fields) > _SHOWN_FIELDS else ")") if fields else ""
    if report["verdict"] == "identical":
        points = f"({report['points']} trace points equal)"
        return f"identical  {report['fingerprint']}  {points}{specs}"
    if report["verdict"] != "diverged":
        return f"{report['verdict']}: {report.get('reason', '')}".rstrip(": ")
    div = report["first_divergence"]
    names = ", ".join(report["variables"][:_SHOWN_VARIABLES]) or "(no variable list)"
    more = len(report["variables"]) - _SHOWN_VARIABLES
    names += f" and {more} more" if more > 0 else ""
    return f"diverged at {div['label']} in {names}; {cause_phrase(report)}{specs}"


def cause_phrase(report: Mapping[str, Any]) -> str:
    """What a diverged report names as the cause, in words: "data equal" only where the data
    fingerprints of the divergent epoch were compared and are equal."""
    cause = report["cause"]
    if cause == "seed":
        return "the specs' seeds differ"
    if cause == "data":
        return "the input data differed"
    if cause == "unknown":
        return "data fingerprints missing"
    if (report.get("data") or {}).get("equal"):
        return "the computation differed (data equal)"
    if report["first_divergence"]["kind"] == "init":
        return "the initial weights differ, before any data"
    return "the computation differed"


def _epochs(epochs: Sequence[int]) -> str:
    shown = ", ".join(str(e) for e in epochs[:_SHOWN_FIELDS])
    more = f" and {len(epochs) - _SHOWN_FIELDS} more" if len(epochs) > _SHOWN_FIELDS else ""
    return f"epoch{'s' if len(epochs) > 1 else ''} {shown}{more}"


def record_from_result(result: JobResult, label: str) -> RunRecord:
    """A run record from a result document; its local checkpoints (if still there) give sizes."""
    checkpoints: dict[int, Path] = {}
    for name in result.checkpoints:
        epoch = checkpoint_epoch(name)
        if epoch is not None and Path(name).is_file():
            checkpoints[epoch] = Path(name)

    def read(epoch: int, paths: Sequence[str]) -> Mapping[str, np.ndarray]:
        return read_variables(checkpoints[epoch], paths)

    return RunRecord(
        label=label,
        status=result.status,
        spec_hash=result.spec_hash,
        granularity=result.trace_granularity,
        final_fingerprint=result.final_fingerprint,
        trace=result.trace,
        data={d.epoch: d.fingerprint for d in result.data_fingerprints},
        provenance=result.provenance,
        warnings=result.warnings,
        checkpoint_epochs=sorted(checkpoints),
        read_checkpoint=read,
        spec=result.spec,
        eval_data=result.eval_data_fingerprint,
    )
