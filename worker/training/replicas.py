"""Data-parallel training over N devices: which devices, which reduction, how a batch splits.

One replica keeps the plain single-device loop (no strategy at all). N > 1 trains under
`tf.distribute.MirroredStrategy` over N GPUs when the process sees at least N, otherwise
over N logical CPU devices carved out of the one physical CPU, so replicas are testable
anywhere. A process that sees some GPUs but fewer than N fails: silently training a GPU
job on the CPU would be a different (and far slower) experiment.

Cross-replica sums use `ReductionToOneDevice` with `add_n`, chosen explicitly: it adds the
replicas' values on one device in replica order, which is bitwise reproducible on CPU and
GPU alike. MirroredStrategy's own default on GPUs is NCCL all-reduce, whose summation
order depends on the ring and is not bitwise deterministic in general.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.errors import ReproError


class DeviceError(ReproError):
    """This worker cannot give the job the devices its spec asks for."""


REDUCTION = "ReductionToOneDevice"
ACCUMULATION = "add_n"


@dataclass
class Placement:
    """Where a job's replicas run; `strategy` is None for one replica."""

    replicas: int
    devices: list[str]
    device_kind: str  # "default", "gpu" or "logical_cpu"
    strategy: Any = None
    notes: list[str] = field(default_factory=list)

    def start(self) -> None:
        """Build the strategy; after `determinism.apply`, whose thread settings come first."""
        if self.replicas == 1 or self.strategy is not None:
            return
        import tensorflow as tf

        self.strategy = tf.distribute.MirroredStrategy(
            devices=self.devices,
            cross_device_ops=tf.distribute.ReductionToOneDevice(
                reduce_to_device=self.devices[0], accumulation_fn=tf.math.add_n
            ),
        )
        if self.strategy.num_replicas_in_sync != self.replicas:
            raise DeviceError(
                f"distribution.replicas is {self.replicas} but the strategy has "
                f"{self.strategy.num_replicas_in_sync} replica(s)"
            )

    def record(self) -> dict[str, Any]:
        """What goes into the job's determinism record."""
        rec: dict[str, Any] = {"replicas": self.replicas, "devices": self.devices}
        if self.strategy is not None:
            rec.update(
                device_kind=self.device_kind,
                strategy="MirroredStrategy",
                cross_device_ops=REDUCTION,
                reduce_to_device=self.devices[0],
                accumulation=ACCUMULATION,
                batch_split="contiguous rows of each global batch, replica i gets rows "
                "[B*i//N, B*(i+1)//N)",
                loss_scaling="per-replica loss sum / global element count; "
                "regularisation losses / N",
            )
        return rec


def place_replicas(replicas: int, *, allow_logical_cpu: bool = True) -> Placement:
    """Make N devices available; call before TensorFlow starts its devices, then `start()`.

    Raises DeviceError naming the count when the devices cannot be had.
    """
    if replicas == 1:
        return Placement(1, [], "default")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < replicas:
            raise DeviceError(
                f"distribution.replicas is {replicas} but this worker has only "
                f"{len(gpus)} GPU(s); a GPU job is not moved to logical CPU devices"
            )
        devices = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(replicas)]
        kind = "gpu"
    else:
        if not allow_logical_cpu:
            raise DeviceError(
                f"distribution.replicas is {replicas} but this worker has no GPU and "
                "logical CPU devices are not allowed here"
            )
        cpu = tf.config.list_physical_devices("CPU")[0]
        wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
        try:
            tf.config.set_logical_device_configuration(cpu, wanted)
        except RuntimeError as exc:
            # TensorFlow has started its devices already; fine only if they are what we need.
            have = len(tf.config.list_logical_devices("CPU"))
            if have < replicas:
                raise DeviceError(
                    f"distribution.replicas is {replicas} but TensorFlow already runs with "
                    f"{have} CPU device(s) in this process ({exc}); start a fresh process"
                ) from exc
        devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas)]
        kind = "logical_cpu"
    return Placement(replicas, devices, kind)


def row_bounds(batch_size: int, replicas: int) -> list[tuple[int, int]]:
    """The [start, end) rows of a global batch each replica trains on."""
    return [(batch_size * i // replicas, batch_size * (i + 1) // replicas) for i in range(replicas)]
