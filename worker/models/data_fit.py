"""Whether a spec's data can feed its architecture, decided without TensorFlow: the sample
shapes and dtypes the generator makes (from its params, or for `arrays` from the stored
dataset's record) against what the architecture takes. The API refuses a misfit at submit
and `repro validate` gives the same answer, instead of a job failing once it has started."""

from __future__ import annotations

from worker.data import arrays_fit
from worker.data.batch_source import DataInfo
from worker.data.dataset_format import DatasetInfo
from worker.errors import ArchitectureError, SpecError, UnknownComponentError
from worker.models import registry
from worker.models.keras_definition import DefinitionInfo
from worker.models.keras_definition import takes_token_ids as definition_takes_token_ids
from worker.spec import ExperimentSpec


def takes_token_ids(spec: ExperimentSpec, definition: DefinitionInfo | None = None) -> bool:
    """Whether the spec's model looks up integer token ids, so integer `x` stays integers:
    the input dtype of the model definition it trains (`definition`, read from the file the
    spec names), else what its architecture says. The API's checks and the job both ask this.
    """
    if spec.model.definition is not None:
        return definition is not None and definition_takes_token_ids(definition)
    try:
        arch = registry.get_component(
            "architecture", spec.model.architecture, loc="model.architecture"
        )
    except UnknownComponentError:
        return False  # a code bundle's, not importable here: its job asks it
    return arch.takes_token_ids()


def check_data_fit(
    spec: ExperimentSpec,
    dataset: DatasetInfo | None = None,
    definition: DefinitionInfo | None = None,
) -> int | None:
    """SpecError naming the field when the data cannot feed the model or cannot serve the
    spec's batches; otherwise the model's parameter count, or None when it is not known.

    `dataset` describes the stored dataset `dataset.data` names; without it an `arrays`
    spec is checked no further than its params. `definition` is the model definition the
    spec trains, when it names one and it is at hand.
    """
    try:
        arch = registry.get_component(
            "architecture", spec.model.architecture, loc="model.architecture"
        )
    except UnknownComponentError:
        arch = None  # a code bundle's, not importable here: its job checks the rest
    info = _sample(spec, dataset, token_ids=takes_token_ids(spec, definition))
    count = arch.sizer("count_parameters") if arch is not None else None
    if arch is None or info is None or count is None:
        return None
    try:
        return int(count(arch.validate_params(spec.model.params, loc="model.params"), info))
    except ArchitectureError as exc:
        msg = f"{spec.model.architecture!r} cannot take this data: {exc}"
        raise SpecError(
            f"model.architecture: {msg}", errors=[_error("model.architecture", msg)]
        ) from None


def _sample(
    spec: ExperimentSpec, dataset: DatasetInfo | None, *, token_ids: bool
) -> DataInfo | None:
    ds = spec.dataset
    if ds.generator != "arrays":
        try:
            return registry.sample_info(spec)
        except UnknownComponentError:
            return None  # a code bundle's generator: its job checks it
    if dataset is None:
        return None
    try:
        return arrays_fit.describe(ds.params, dataset, ds, token_ids=token_ids)
    except arrays_fit.FitError as exc:
        msg = f"the dataset {ds.data} does not fit this spec: {exc.msg}"
        raise SpecError(f"{exc.loc}: {msg}", errors=[_error(exc.loc, msg)]) from None


def _error(loc: str, msg: str) -> dict[str, str]:
    return {"loc": loc, "msg": msg}
