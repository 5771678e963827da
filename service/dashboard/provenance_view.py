"""A run's record as an auditor reads it: provenance in groups, the seed ledger, the
determinism hazards, the trace marked against the family reference, and its curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.dashboard import charts
from service.dashboard.web import finite
from service.persistence.models import Run, TracePointRow, Verdict
from service.verification.verdicts import family_references

# (group title, provenance keys shown in it), in the order an auditor checks them.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Code and package set", ("package", "packages", "python")),
    ("Image", ("image",)),
    ("Libraries", ("libraries",)),
    ("CUDA, cuDNN, driver and GPU", ("cuda", "gpus", "tf_gpus")),
    ("CPU and OS", ("cpu", "os")),
    ("Threads", ("threads",)),
    ("Determinism settings", ("determinism",)),
    # Values of the variables known to change numerics; keyed digests of all the others.
    ("Environment variables", ("environment", "environment_digests")),
)
_LEDGER_KEYS = ("seed", "seeded", "init_seed", "reseed", "python_hash_seed", "hash_randomization")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists and scalars stay values."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value} if prefix else {}


def groups(provenance: Mapping[str, Any] | None) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The provenance in titled groups of (field, value); fields of no group come last."""
    provenance = provenance or {}
    shown: set[str] = {"seed", "spec_hash", "captured_at"}
    out = []
    for title, keys in GROUPS:
        fields = [
            (f"{key}.{sub}" if sub else key, value)
            for key in keys
            if key in provenance
            for sub, value in (flatten(provenance[key]) or {"": provenance[key]}).items()
        ]
        shown.update(keys)
        out.append((title, fields))
    rest = [(k, v) for k, v in flatten(provenance).items() if k.split(".")[0] not in shown]
    if rest:
        out.append(("Other", rest))
    return out


def seed_ledger(run: Run) -> list[tuple[str, Any]]:
    """Every seed of the run and where it came from."""
    experiment = run.experiment
    determinism = (run.provenance or {}).get("determinism") or {}
    ledger: list[tuple[str, Any]] = [
        ("resolved seed", list(experiment.seed)),
        ("seed source", "set in the spec" if experiment.seed_source == "spec" else "generated"),
    ]
    ledger += [(key, determinism[key]) for key in _LEDGER_KEYS if key in determinism]
    data = run.data_fingerprints or []
    if data:
        ledger.append(("data fingerprints", f"{len(data)} epochs recorded"))
    return ledger


def hazards(run: Run) -> list[str]:
    """What could make a rerun of this run differ, from what it recorded."""
    provenance = run.provenance or {}
    determinism = provenance.get("determinism") or {}
    threads = provenance.get("threads") or {}
    image = provenance.get("image") or {}
    found = []
    if determinism.get("op_determinism") is False:
        found.append("Op determinism was off: GPU kernels may reduce in a varying order.")
    if determinism.get("tf32") is True and (provenance.get("gpus") or provenance.get("tf_gpus")):
        found.append("TF32 on: results differ between GPU models.")
    if determinism.get("hash_randomization") is True:
        found.append("Python hash randomization was on (PYTHONHASHSEED not fixed).")
    for warning in (run.result_summary or {}).get("warnings") or []:
        found.append(f"Job warning: {warning}")
    pinned = [run.required_image, image.get("digest")]
    if provenance and not any(p and "sha256:" in str(p) for p in pinned):
        found.append("The image is not pinned by digest: a rerun may run other libraries.")
    intra, inter = threads.get("intra_op"), threads.get("inter_op")
    if provenance and (not intra or not inter):
        found.append(
            "Thread counts were left to the machine (intra-op "
            f"{intra or 'auto'}, inter-op {inter or 'auto'}): another CPU may reduce differently."
        )
    if (provenance.get("package") or {}).get("git_dirty"):
        found.append("The code had uncommitted changes (git dirty): the commit does not pin it.")
    return found


def reference_id(db: Session, run: Run) -> int | None:
    """The run this one is judged against: its verdict's reference, else its family's."""
    verdict = db.scalar(select(Verdict.reference_run_id).where(Verdict.run_id == run.id))
    if verdict is not None:
        return verdict
    if run.family_id is None:
        return None
    first = family_references(db, {run.family_id}).get(run.family_id)
    return first if first != run.id else None


@dataclass(frozen=True)
class TraceRow:
    kind: str
    epoch: int
    step: int
    fingerprint: str
    mark: str  # "equal", "different", "" (no such point in the reference)


def fingerprints_of(db: Session, run_id: int) -> list[dict[str, Any]]:
    """A run's trace points without their per-variable digests (what the run page shows)."""
    rows = db.execute(
        select(TracePointRow.kind, TracePointRow.epoch, TracePointRow.step,
               TracePointRow.fingerprint)
        .where(TracePointRow.run_id == run_id)
        .order_by(TracePointRow.seq)
    )  # fmt: skip
    return [{"kind": k, "epoch": e, "step": s, "fingerprint": f} for k, e, s, f in rows]


def marked_trace(
    trace: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]] | None
) -> list[TraceRow]:
    """The trace with each point marked equal or different against the reference's."""
    ref = {(p["kind"], p["epoch"], p["step"]): p["fingerprint"] for p in reference or []}
    rows = []
    for p in trace:
        other = ref.get((p["kind"], p["epoch"], p["step"]))
        mark = "" if other is None else ("equal" if other == p["fingerprint"] else "different")
        rows.append(TraceRow(p["kind"], p["epoch"], p["step"], p["fingerprint"], mark))
    return rows


def _rows(metrics: Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    # Stored before values were checked, a "row" may be anything a worker sent.
    return [row for row in metrics or [] if isinstance(row, Mapping)]


def metric_names(metrics: Sequence[Mapping[str, Any]] | None) -> list[str]:
    names: list[str] = []
    for row in _rows(metrics):
        for key, value in row.items():
            numeric = finite(value) is not None
            if numeric and key not in ("epoch", "step", "seconds") and key not in names:
                names.append(key)
    return names


def series(
    metrics: Sequence[Mapping[str, Any]] | None,
    name: str,
    label: str,
    *,
    x: str = "epoch",
    dashed: bool = False,
) -> charts.Series:
    """`name` over `x` from metrics rows, with the rows' global steps as another x where
    every row has one (an epoch row does: the step it ended at)."""
    rows = [(finite(r.get(x)), finite(r.get("step")), finite(r.get(name))) for r in _rows(metrics)]
    kept = [(px, step, y) for px, step, y in rows if px is not None and y is not None]
    steps = [step for _, step, _ in kept if step is not None]
    other = {"step": steps} if x != "step" and kept and len(steps) == len(kept) else {}
    return charts.Series(label, [(px, y) for px, _, y in kept], dashed, other)


def curves(
    metrics: Sequence[Mapping[str, Any]] | None, run_label: str = "", x: str = "epoch"
) -> list[charts.Chart]:
    """One chart per metric over `x` (epoch, or step), loss first; points name `run_label`
    on hover."""
    names = sorted(metric_names(metrics), key=lambda n: (n != "loss", n))
    title = "{} by step" if x == "step" else "{}"
    found = [
        charts.chart([series(metrics, name, run_label or name, x=x)], title=title.format(name),
                     x_label=x)
        for name in names
    ]  # fmt: skip
    return [c for c in found if c is not None]


def provenance_context(*, db: Session, run: Run) -> dict[str, Any]:
    """The template context of a run's provenance, shared by the run page and certificate."""
    reference = reference_id(db, run)
    trace = fingerprints_of(db, run.id)
    return {
        "reference": reference,
        "trace": marked_trace(trace, fingerprints_of(db, reference) if reference else None),
        "groups": groups(run.provenance),
        "ledger": seed_ledger(run),
        "hazards": hazards(run),
        "curves": curves(run.metrics, f"run {run.id}"),
        "step_curves": curves(run.step_metrics, f"run {run.id}", x="step"),
    }
