"""The spec's loss as a Keras loss: a built-in by its Keras class, or a factory a plugin or the
run's code bundle declares in `reprotrain.losses` (`my_loss(params: dict) -> keras.losses.Loss`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from worker.errors import SpecError
from worker.models import registry

# Builds the loss with its own reduction (None) or another one ("none": per element, for the
# replicas' steps, which reduce over the global batch themselves).
LossMaker = Callable[[str | None], Any]


def loss_maker(name: str, params: dict[str, Any]) -> LossMaker:
    """A builder of the loss `name` with `params`; SpecError at `training.loss.name` when a
    declared factory does not return a `keras.losses.Loss`."""
    custom = registry.loss_component(name)
    if custom is None:
        class_name = registry.LOSSES[name]

        def builtin(reduction: str | None) -> Any:
            config = {**params, **({"reduction": reduction} if reduction else {})}
            return keras.losses.get({"class_name": class_name, "config": config})

        return builtin
    factory = custom.load()
    checked = custom.validate_params(params, loc="training.loss.params")

    def declared(reduction: str | None) -> Any:
        loss = factory(dict(checked))
        if not isinstance(loss, keras.losses.Loss):
            msg = (
                f"loss {name!r} ({custom.target}, from {custom.source}) returned "
                f"{type(loss).__name__}, not a keras.losses.Loss"
            )
            raise SpecError(msg, errors=[{"loc": "training.loss.name", "msg": msg}])
        if reduction:
            loss.reduction = reduction
        return loss

    return declared
