"""The structure of a run's final checkpoint checked against what the run must hold.

A worker reports the variable paths its final checkpoint holds, and the server fingerprints
the checkpoint with them; so a self-consistent checkpoint of any arrays at all would pass
that check. Here the paths, dtypes and shapes (from the npz's member headers, nothing
inflated) are compared with what is known independently of the worker: the layout the
spec determines (computed without TensorFlow) for a built-in architecture on a built-in
generator or on a stored dataset whose record gives its sample, and for a stored Keras model
definition (from the definition's layers, `worker.models.definition_layout`); otherwise
(code bundles, plugins) the paths of the run's first trace point and the final checkpoint
of the family's reference run, which the server checked in its turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.models import Artifact, Experiment, Run, TracePointRow
from service.storage import blob_store, datasets, model_definitions
from service.verification import verdicts
from worker.data import arrays_fit
from worker.data.batch_source import DataInfo
from worker.errors import CheckpointError, ReproError
from worker.models import data_fit, registry
from worker.models import definition_layout as dl
from worker.models import model_size as ms
from worker.models.keras_definition import DefinitionLimits, DefinitionRefused, read_definition
from worker.record.npz_reader import inspect_npz
from worker.result import JobResult
from worker.spec import ExperimentSpec, parse_spec

Key = tuple[str, str, tuple[int, ...]]  # (path, dtype, shape)
Difference = tuple[str, str]  # (path, what differs); no path for an order difference
_SHOWN = 5  # differences named in a message


def spec_layout(spec: ExperimentSpec, data: DataInfo | None = None) -> list[Key] | None:
    """The checkpoint layout a built-in job of this spec saves; None if not known from it.

    `data` is one sample of a stored dataset (`arrays`), whose shapes the spec does not say.
    """
    generators = registry.components("generator")
    generator = generators.get(spec.dataset.generator)
    if (
        spec.model.architecture not in ms.MODEL_VARIABLES
        or spec.model.definition is not None
        or generator is None
        or generator.source != "builtin"
    ):
        return None
    data = data or registry.sample_info(spec)
    if data is None:  # stored arrays not described: their shapes are the dataset's
        return None
    layout = ms.training_state_layout(
        spec.model.architecture,
        spec.model.params,
        data,
        optimizer=registry.OPTIMIZERS[spec.training.optimizer.name],
        optimizer_params=spec.training.optimizer.params,
    )
    return [v.key for v in layout]


def stored_sample(db: Session, spec: ExperimentSpec) -> DataInfo | None:
    """One sample of the stored dataset an `arrays` spec trains on, as its job gets it, from
    the dataset's record; None when the spec names none or the record does not say."""
    ds = spec.dataset
    if ds.generator != "arrays" or ds.data is None:
        return None
    described = datasets.described(db, ds.data)
    if described is None:
        return None
    try:
        return arrays_fit.describe(
            ds.params, described, ds, token_ids=data_fit.takes_token_ids(spec)
        )
    except (arrays_fit.FitError, ReproError, ValueError):  # the job says why it cannot train
        return None


def definition_layout(db: Session, spec: ExperimentSpec) -> list[Key] | None:
    """The checkpoint layout a job training the spec's stored model definition saves, from
    the definition's layers; None when it is not stored here or its layout is not derivable."""
    stored = model_definitions.find(db, spec.model.definition or "")
    if spec.model.definition is None or stored is None:
        return None
    try:
        data = blob_store.read_bytes(stored.storage_url, stored.digest)
        # Accepted at push under this server's bounds: read again with bounds that admit it.
        limits = DefinitionLimits(
            max_bytes=len(data),
            max_depth=10_000,
            max_layers=max(DefinitionLimits().max_layers, stored.layer_count),
        )
        layout = dl.definition_state_layout(
            read_definition(data, limits=limits),
            optimizer=registry.OPTIMIZERS[spec.training.optimizer.name],
            optimizer_params=spec.training.optimizer.params,
        )
    except (OSError, DefinitionRefused, dl.LayoutUnknown, ReproError, KeyError, ValueError):
        return None
    return [v.key for v in layout]


def npz_layout(npz_path: Path, order: Sequence[str], *, max_bytes: int | None) -> list[Key]:
    """(path, dtype, shape) of each member `v{i}` (holding `order[i]`), from headers only."""
    members = inspect_npz(npz_path, max_members=len(order), max_bytes=max_bytes)
    if set(members) != {f"v{i}" for i in range(len(order))}:
        raise CheckpointError(f"{npz_path.name}: holds other arrays than v0..v{len(order) - 1}")
    found = (members[f"v{i}"] for i in range(len(order)))
    return [(path, m.dtype.name, tuple(m.shape)) for path, m in zip(order, found, strict=True)]


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def differences(expected: Sequence[Key], found: Sequence[Key]) -> list[Difference]:
    """What differs between two layouts, (path, what) per variable: missing, unexpected,
    dtype or shape; or their order, when they hold the same variables. Empty if they agree."""
    wanted = {path: (dtype, shape) for path, dtype, shape in expected}
    held = {path for path, _, _ in found}
    lines = []
    for path, dtype, shape in found:
        if path not in wanted:
            lines.append((path, f"unexpected {path} ({dtype} {_shape(shape)})"))
        elif wanted[path][0] != dtype:
            lines.append((path, f"{path}: dtype {dtype}, expected {wanted[path][0]}"))
        elif wanted[path][1] != shape:
            want = _shape(wanted[path][1])
            lines.append((path, f"{path}: shape {_shape(shape)}, expected {want}"))
    lines += [(path, f"missing {path}") for path, _, _ in expected if path not in held]
    return lines or _order([k[0] for k in expected], found)


def path_differences(expected: Sequence[str], found: Sequence[Key]) -> list[Difference]:
    """As `differences`, against variable paths alone (a trace point records no shapes)."""
    wanted, held = set(expected), {path for path, _, _ in found}
    lines = [
        (path, f"unexpected {path} ({dtype} {_shape(shape)})")
        for path, dtype, shape in found
        if path not in wanted
    ]
    lines += [(path, f"missing {path}") for path in expected if path not in held]
    return lines or _order(list(expected), found)


def _order(expected: list[str], found: Sequence[Key]) -> list[Difference]:
    if expected == [k[0] for k in found]:
        return []
    return [("", "the variables are in another order than expected")]


def _reference_layout(db: Session, run: Run, *, max_bytes: int | None) -> list[Key] | None:
    """The final checkpoint layout of the family's reference run of the same spec, if any."""
    family = run.family_id or run.id
    reference_id = verdicts.family_references(db, {family}).get(family)
    reference = db.get(Run, reference_id) if reference_id is not None else None
    if reference is None or reference.id == run.id or reference.status != "succeeded":
        return None
    ids = [run.experiment_id, reference.experiment_id]
    specs = select(Experiment.spec_hash).where(Experiment.id.in_(ids))
    if len(set(db.scalars(specs))) != 1:
        return None
    last = db.scalar(
        select(TracePointRow)
        .where(TracePointRow.run_id == reference.id)
        .order_by(TracePointRow.seq.desc())
        .limit(1)
    )
    if last is None:
        return None
    npz = db.scalar(
        select(Artifact).where(
            Artifact.run_id == reference.id,
            Artifact.kind == "checkpoint",
            Artifact.epoch == last.epoch,
            Artifact.name.like("%.npz"),
        )
    )
    if npz is None:
        return None
    order = list(last.variables)
    try:
        with blob_store.local_copy(npz.storage_url, npz.sha256, max_bytes=max_bytes) as path:
            return npz_layout(path, order, max_bytes=max_bytes)
    except (CheckpointError, OSError):  # its checkpoint is gone: nothing to compare with
        return None


def structure_differences(
    *, db: Session, run_id: int, result: JobResult, npz_path: Path, max_bytes: int | None
) -> tuple[list[Difference], str]:
    """What differs in a succeeded result's final checkpoint from what the run must hold,
    and what it was checked against (no differences: it holds what it must)."""
    found = npz_layout(npz_path, list(result.trace[-1].variables), max_bytes=max_bytes)
    run = db.get(Run, run_id)
    if run is None:
        return [], "nothing"
    try:
        spec = parse_spec(run.experiment.spec)
        expected = spec_layout(spec, stored_sample(db, spec))
    except (ReproError, ValueError):  # a spec no built-in job could train: checked as others
        spec, expected = None, None
    if expected is not None:
        return differences(expected, found), "the layout its spec determines"
    expected = definition_layout(db, spec) if spec is not None else None
    if expected is not None:
        # A hand-written config may list its layers out of graph order, which Keras's own
        # order follows: every variable, dtype and shape is checked, not their order.
        lines = [line for line in differences(expected, found) if line[0]]
        return lines, "the layout its model definition determines"
    lines = path_differences(list(result.trace[0].variables), found)
    if lines:
        return lines, "the variables of its first trace point"
    reference = _reference_layout(db, run, max_bytes=max_bytes)
    if reference is not None:
        return differences(reference, found), "the final checkpoint of its family's reference"
    return [], "the variables of its first trace point"
