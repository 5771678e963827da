"""The `keras` architecture: a stored model definition, checked again and loaded in safe mode.

The job is given the definition's file (`--model-file`), whose digest it checked against
the spec's `model.definition`. Before Keras sees it, the TensorFlow-free checker walks it
again (the same allow-list the API applied at push), its parameter count is held against
the worker's limit and its input against the data; only then is it deserialized, with
Keras's safe mode on, so no Python code in it can run.
"""

from __future__ import annotations

from typing import Any

import keras

from worker.data.batch_source import DataInfo
from worker.errors import ArchitectureError
from worker.models import keras_definition as kd


def from_definition(
    params: dict[str, Any], data: DataInfo, *, definition: bytes | None = None
) -> keras.Model:
    """The model the definition describes, fresh (its weights initialised by Keras under
    the job's seed, never read from the definition)."""
    if definition is None:
        raise ArchitectureError(
            "the keras architecture builds the model definition the job is given "
            "(--model-file); none was given"
        )
    try:
        info = kd.read_definition(definition)
        kd.check_fits(info, data)
    except kd.DefinitionRefused as exc:
        raise ArchitectureError(f"model definition refused: {exc}") from None
    model = keras.saving.deserialize_keras_object(info.config, safe_mode=True)
    if not isinstance(model, keras.Model):
        raise ArchitectureError("the model definition did not make a keras.Model")
    return model
