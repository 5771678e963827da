"""How one job trains beyond what its spec says: checkpoints, resume, stops, tracing, loop mode.

TensorFlow-free, so a job can build its options before TensorFlow is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def never_stop(epoch: int) -> bool:
    """The stop request of a job nothing can interrupt."""
    return False


def never_now() -> bool:
    """The step-level stop request of a job nothing can interrupt."""
    return False


def nothing() -> None:
    """A notification no one waits for."""


@dataclass(frozen=True)
class TrainingOptions:
    """The job's choices that leave the spec, and so its hash, unchanged.

    `stop_requested(epoch)` is asked after each epoch but the last; when it says yes,
    training checkpoints that epoch and returns early with `interrupted_after_epoch` set.
    `stop_now()` is asked after every call of optimizer steps: when it says yes and there
    is a checkpoint directory, training checkpoints that step and returns early with
    `interrupted_at_step` set (a preempted job's grace period need not last an epoch).
    `trace_every_steps` overrides the spec's trace granularity and `until_epoch` ends
    training after that epoch (as finished, not interrupted): together they re-trace one
    stretch of a run step by step without changing its spec.
    """

    checkpoint_dir: Path | None = None  # epoch checkpoints, and step ones if the spec asks
    resume: bool = False  # from the newest intact checkpoint of either kind
    stop_requested: Callable[[int], bool] = never_stop
    stop_now: Callable[[], bool] = never_now
    # An operator's limit on the model's parameters, checked before any weight is allocated
    # when the size is arithmetic on the spec.
    max_model_parameters: int | None = None
    # An operator's limit on the values in a model definition's largest tensor for one
    # batch, checked before Keras builds the model.
    max_activation_elements: int | None = None
    trace_every_steps: int | None = None
    until_epoch: int | None = None
    # Ends training after this global step, mid-epoch (a spot check's replay of the stretch
    # between two step checkpoints): its last trace point and checkpoint are at that step.
    until_step: int | None = None
    # Whether a GPU-less process may split its CPU into logical devices for replicas.
    allow_logical_devices: bool = True
    # The loop as it once was: a dataset per epoch and TensorFlow reseeded every epoch,
    # whatever the steps draw (slower; the same bits, which a test checks).
    classic: bool = False
    # Called once a host of several has joined its cluster (the strategy is built).
    joined: Callable[[], None] = nothing
