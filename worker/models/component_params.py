"""Allowed parameters of the built-in optimizers and losses (TensorFlow-free).

A spec's `training.optimizer.params` and `training.loss.params` become keyword arguments
of a Keras class. Each class gets an allow-list here — names, types and ranges — so a
typo (`lr`), a string where a number belongs, a NaN or a negative learning rate is a 422
at submission, not a crash or a silently different run on a worker. The integration
tests check every name against the real Keras signature, so the lists cannot drift.
Validation only accepts or refuses: the params Keras gets are the ones the spec holds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from worker.errors import SpecError
from worker.spec import format_validation_error, integral


class _Params(BaseModel):
    # strict: "0.1" or true is not a number, 1 is still a float; frozen: nothing mutates it.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


Positive = Annotated[float, Field(allow_inf_nan=False, gt=0)]
NonNegative = Annotated[float, Field(allow_inf_nan=False, ge=0)]
# Decay rates: 1 would divide by zero in Adam-style bias correction.
Fraction = Annotated[float, Field(allow_inf_nan=False, ge=0, lt=1)]
UnitInterval = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1)]
Count = Annotated[int, BeforeValidator(integral), Field(ge=1, le=1_000_000)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]


class OptimizerParams(_Params):
    """Arguments every Keras 3 optimizer takes."""

    learning_rate: Positive = 0.001
    weight_decay: NonNegative | None = None
    clipnorm: Positive | None = None
    clipvalue: Positive | None = None
    global_clipnorm: Positive | None = None
    use_ema: StrictBool = False
    ema_momentum: UnitInterval = 0.99
    ema_overwrite_frequency: Count | None = None
    loss_scale_factor: Positive | None = None
    gradient_accumulation_steps: Count | None = None
    name: Name | None = None

    @model_validator(mode="after")
    def _one_clipping(self) -> OptimizerParams:
        # Keras refuses more than one of them, but only when the optimizer is built.
        given = [k for k in ("clipnorm", "clipvalue", "global_clipnorm") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"set at most one of clipnorm, clipvalue, global_clipnorm: {given}")
        return self


class AdamParams(OptimizerParams):
    beta_1: Fraction = 0.9
    beta_2: Fraction = 0.999
    epsilon: Positive = 1e-7
    amsgrad: StrictBool = False


class AdamaxParams(OptimizerParams):
    beta_1: Fraction = 0.9
    beta_2: Fraction = 0.999
    epsilon: Positive = 1e-7


class SGDParams(OptimizerParams):
    momentum: UnitInterval = 0.0
    nesterov: StrictBool = False


class RMSpropParams(OptimizerParams):
    rho: Fraction = 0.9
    momentum: Fraction = 0.0
    epsilon: Positive = 1e-7
    centered: StrictBool = False


class AdagradParams(OptimizerParams):
    initial_accumulator_value: NonNegative = 0.1
    epsilon: Positive = 1e-7


class LionParams(OptimizerParams):
    beta_1: UnitInterval = 0.9
    beta_2: UnitInterval = 0.99


class LossParams(_Params):
    """Arguments every Keras 3 loss takes."""

    # "none" would give a loss per sample; training needs one number per batch.
    reduction: Literal["sum_over_batch_size", "sum", "mean", "mean_with_sample_weight"] = (
        "sum_over_batch_size"
    )
    name: Name | None = None
    dtype: Literal["float16", "bfloat16", "float32", "float64"] | None = None


Axis = Annotated[int, BeforeValidator(integral), Field(ge=-8, le=8)]


class SparseCategoricalCrossentropyParams(LossParams):
    from_logits: StrictBool = False
    ignore_class: Annotated[int, BeforeValidator(integral), Field(ge=-1, le=2**31 - 1)] | None = (
        None
    )
    axis: Axis = -1


class CrossentropyParams(LossParams):
    from_logits: StrictBool = False
    label_smoothing: UnitInterval = 0.0
    axis: Axis = -1


class HuberParams(LossParams):
    delta: Positive = 1.0


# Keyed by the Keras class name (registry.OPTIMIZERS / LOSSES map spec names onto these).
OPTIMIZER_PARAMS: dict[str, type[OptimizerParams]] = {
    "Adam": AdamParams,
    "AdamW": AdamParams,
    "Nadam": AdamaxParams,
    "Adamax": AdamaxParams,
    "SGD": SGDParams,
    "RMSprop": RMSpropParams,
    "Adagrad": AdagradParams,
    "Lion": LionParams,
}
LOSS_PARAMS: dict[str, type[LossParams]] = {
    "SparseCategoricalCrossentropy": SparseCategoricalCrossentropyParams,
    "CategoricalCrossentropy": CrossentropyParams,
    "BinaryCrossentropy": CrossentropyParams,
    "MeanSquaredError": LossParams,
    "MeanAbsoluteError": LossParams,
    "Huber": HuberParams,
}


def validate(model: type[BaseModel], params: dict[str, Any], *, loc: str, what: str) -> None:
    """Raise SpecError naming each bad field (`loc.field`) if `params` do not fit `model`."""
    try:
        model.model_validate(params)
    except ValidationError as exc:
        errors = [
            {"loc": loc if e["loc"] == "$" else f"{loc}.{e['loc']}", "msg": e["msg"]}
            for e in format_validation_error(exc)
        ]
        detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise SpecError(f"invalid {what} params: {detail}", errors=errors) from None
