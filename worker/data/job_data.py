"""A job's training and evaluation data: the spec's generator, given the stored dataset if
its factory reads one, wrapped in stateless datasets."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.data.batch_source import BatchSource
from worker.data.stateless_dataset import AUTOTUNE, StatelessRngDataset
from worker.errors import GeneratorError
from worker.models import registry
from worker.models.data_fit import takes_token_ids
from worker.models.keras_definition import DefinitionInfo
from worker.spec import ExperimentSpec
from worker.training.seeds import SeedTuple

EVAL_STREAM = 1  # fold-in key that keeps evaluation data apart from training data


@dataclass
class JobData:
    """The source, its training dataset factory, its evaluation one, and what to warn about."""

    source: BatchSource
    train: StatelessRngDataset
    eval: StatelessRngDataset | None
    warnings: list[str] = field(default_factory=list)


def _takes(factory: Callable[..., Any], argument: str) -> bool:
    try:
        return argument in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without a signature: the old contract
        return False


def build_job_data(
    spec: ExperimentSpec,
    seed: SeedTuple,
    *,
    data: dict[str, np.ndarray] | None = None,
    definition: DefinitionInfo | None = None,
    own_shards: tuple[int, int] | None = None,
) -> JobData:
    """The job's data (`definition`: the model definition the spec trains, if any; a host
    of several trains on `own_shards` of each batch, and evaluates on whole batches);
    GeneratorError if the generator breaks its contract or the dataset is too small for
    the spec's batches."""
    ds = spec.dataset
    gen = registry.get_component("generator", ds.generator, loc="dataset.generator")
    factory = gen.load()
    params = gen.validate_params(ds.params, loc="dataset.params")
    warnings: list[str] = []
    extra: dict[str, Any] = {}
    if _takes(factory, "token_ids"):
        # Whether the model looks up integer token ids, by the rule the API checked at submit.
        extra["token_ids"] = takes_token_ids(spec, definition)
    if _takes(factory, "data"):
        source = factory(params, batch_size=ds.batch_size, data=data, **extra)
    else:
        if data is not None:
            warnings.append(
                f"generator {ds.generator!r} does not read stored datasets: dataset.data "
                "names a dataset this run never used"
            )
        source = factory(params, batch_size=ds.batch_size, **extra)
    if not isinstance(source, BatchSource):
        raise GeneratorError(ds.generator, "its factory must return a BatchSource")
    _check_sizes(spec, source)
    options: dict[str, Any] = {
        "batch_size": ds.batch_size,
        "base_seed": seed,
        "num_parallel_calls": AUTOTUNE
        if ds.num_parallel_calls == "autotune"
        else ds.num_parallel_calls,
        "prefetch_buffer": AUTOTUNE if ds.prefetch == "autotune" else ds.prefetch,
        "deterministic_order": ds.deterministic_order,
        "xla_compile_generator": ds.xla,
        "assert_cardinality": True,
        "forbid_stateful_rng": spec.determinism.op_determinism,
        "name": ds.generator,
        "row_shards": ds.shards,
    }
    train = StatelessRngDataset(
        source.batch_generator,
        num_batches=ds.train_batches,
        pass_epoch_seed=source.takes_epoch_seed,
        own_shards=own_shards,
        **options,
    )
    if train.stateful_random_ops:
        warnings.append(
            f"generator {ds.generator!r} uses stateful RNG ops "
            f"({', '.join(train.stateful_random_ops)}): its data is not reproducible"
        )
    evaluation = None
    if ds.eval_batches and source.eval_batch_generator is not None:
        evaluation = StatelessRngDataset(
            source.eval_batch_generator,
            num_batches=ds.eval_batches,
            stream=EVAL_STREAM,
            **options,
        )
    elif ds.eval_batches:
        evaluation = train.with_options(
            num_batches=ds.eval_batches, stream=EVAL_STREAM, epoch=0, own_shards=None
        )
    return JobData(source, train, evaluation, warnings)


def _check_sizes(spec: ExperimentSpec, source: BatchSource) -> None:
    ds = spec.dataset
    if source.train_samples is not None and ds.train_batches * ds.batch_size > source.train_samples:
        raise GeneratorError(
            ds.generator,
            f"an epoch of {ds.train_batches} batches of {ds.batch_size} needs "
            f"{ds.train_batches * ds.batch_size} training samples; the data has "
            f"{source.train_samples} (each appears at most once per epoch)",
        )
    if source.train_samples is not None and ds.eval_batches:
        held_out = source.eval_samples or 0
        if ds.eval_batches * ds.batch_size > held_out:
            raise GeneratorError(
                ds.generator,
                f"{ds.eval_batches} evaluation batches of {ds.batch_size} need "
                f"{ds.eval_batches * ds.batch_size} held-out samples; the data has {held_out}",
            )
