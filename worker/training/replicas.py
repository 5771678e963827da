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

H > 1 hosts (`distribution.hosts`) train under `tf.distribute.MultiWorkerMirroredStrategy`,
one process per host, whose cluster `TF_CONFIG` describes. Its cross-host sums are
TensorFlow's collective ring all-reduce, set explicitly (`CommunicationImplementation.RING`,
never NCCL): each tensor is cut into chunks and each chunk's partial sum travels the ring of
replicas in an order fixed by R, the global replica count, not by timing, so a cluster of
the same size adds in the same order on every run (measured: hosts x replicas of 2x2, 4x1
and 1x4 under this strategy give equal bits). On GPUs the same RING
implementation is used (NCCL's order depends on its channel and algorithm choices, which
are tuned to the topology). A host's replicas are global replicas rank*N .. rank*N+N-1 and
it holds only their rows of each global batch. A host without GPUs takes one replica on
its CPU, or N on N logical CPU devices (`_host_cpu_devices`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from worker.errors import ReproError


class DeviceError(ReproError):
    """This worker cannot give the job the devices its spec asks for."""


REDUCTION = "ReductionToOneDevice"
ACCUMULATION = "add_n"
HOSTS_REDUCTION = "CollectiveAllReduce (RING)"


@dataclass
class Placement:
    """Where a job's replicas run; `strategy` is None for one replica."""

    replicas: int  # on this host
    devices: list[str]
    device_kind: str  # "default", "gpu", "logical_cpu"; "cpu" (one) on a host of several
    strategy: Any = None
    notes: list[str] = field(default_factory=list)
    hosts: int = 1
    rank: int = 0  # this host's place among them: its task index in TF_CONFIG

    @property
    def total_replicas(self) -> int:
        return self.hosts * self.replicas

    @property
    def first_replica(self) -> int:
        """The global index of this host's first replica."""
        return self.rank * self.replicas

    def host_rows(self, batch_size: int) -> tuple[int, int]:
        """The [start, end) rows of each global batch that this host trains on."""
        return (batch_size * self.rank // self.hosts, batch_size * (self.rank + 1) // self.hosts)

    def start(self) -> None:
        """Build the strategy; after `determinism.apply`, whose thread settings come first."""
        if self.total_replicas == 1 or self.strategy is not None:
            return
        import tensorflow as tf

        if self.hosts > 1:
            self._start_hosts(tf)
            return
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

    def _start_hosts(self, tf: Any) -> None:
        """Join the cluster TF_CONFIG describes; blocks until every host has joined."""
        collective = tf.distribute.experimental
        options = collective.CommunicationOptions(
            implementation=collective.CommunicationImplementation.RING
        )
        cpus = self.device_kind == "logical_cpu"
        with _host_cpu_devices(self.replicas) if cpus else nullcontext():
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        if self.strategy.num_replicas_in_sync != self.total_replicas:
            raise DeviceError(
                f"distribution is {self.hosts} host(s) x {self.replicas} replica(s) but the "
                f"cluster has {self.strategy.num_replicas_in_sync} replica(s) in all"
            )
        self.devices = [str(d) for d in self.strategy.extended.worker_devices]

    def record(self) -> dict[str, Any]:
        """What goes into the job's determinism record (the same on every host)."""
        if self.hosts > 1:
            return {
                "hosts": self.hosts,
                "replicas": self.replicas,
                "device_kind": self.device_kind,
                "strategy": "MultiWorkerMirroredStrategy",
                "cross_device_ops": HOSTS_REDUCTION,
                "batch_split": "contiguous rows of each global batch, global replica "
                "r = host*N + i gets rows [B*r//R, B*(r+1)//R) of R = hosts*N; a host "
                "generates only its own dataset shards",
                "loss_scaling": "per-replica loss sum / global element count; "
                "regularisation losses / R",
            }
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


def place_replicas(
    replicas: int,
    *,
    allow_logical_cpu: bool = True,
    hosts: int = 1,
    rank: int = 0,
) -> Placement:
    """Make N devices available; call before TensorFlow starts its devices, then `start()`.

    Raises DeviceError naming the count when the devices cannot be had.
    """
    if hosts > 1:
        return _place_on_host(replicas, hosts=hosts, rank=rank, allow_logical_cpu=allow_logical_cpu)
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
        _logical_cpus(tf, replicas)
        devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas)]
        kind = "logical_cpu"
    return Placement(replicas, devices, kind)


def _logical_cpus(tf: Any, replicas: int) -> None:
    """Split the one physical CPU into `replicas` logical devices (before TensorFlow starts)."""
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


def _place_on_host(
    replicas: int, *, hosts: int, rank: int, allow_logical_cpu: bool = True
) -> Placement:
    """This host's N devices of a cluster: N GPUs (only they are made visible, since
    MultiWorkerMirroredStrategy takes every visible GPU), the one CPU, or N logical CPU
    devices."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < replicas:
            raise DeviceError(
                f"distribution.replicas is {replicas} per host but this worker has only "
                f"{len(gpus)} GPU(s); a GPU job is not moved to the CPU"
            )
        tf.config.set_visible_devices(gpus[:replicas], "GPU")
        return Placement(replicas, [], "gpu", hosts=hosts, rank=rank)
    if replicas > 1:
        if not allow_logical_cpu:
            raise DeviceError(
                f"distribution.replicas is {replicas} per host but this worker has no GPU "
                "and logical CPU devices are not allowed here"
            )
        _logical_cpus(tf, replicas)
        return Placement(replicas, [], "logical_cpu", hosts=hosts, rank=rank)
    return Placement(1, [], "cpu", hosts=hosts, rank=rank)


@contextmanager
def _host_cpu_devices(replicas: int) -> Iterator[None]:
    """While MultiWorkerMirroredStrategy is built, give it this host's `replicas` logical
    CPU devices: on a host without GPUs it takes one CPU device whatever logical devices
    exist (`CollectiveAllReduceExtended._initialize_local_devices`, TensorFlow's own code,
    with no public switch), which leaves replicas on the CPU untestable across hosts. The
    method is called once, from the strategy's constructor; it is restored after."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    extended = getattr(collective, "CollectiveAllReduceExtended", None)
    original = getattr(extended, "_initialize_local_devices", None)
    if extended is None or original is None:
        raise DeviceError(
            f"distribution.replicas is {replicas} per host on a host without GPUs, which this "
            "TensorFlow version cannot place; set distribution.replicas to 1 (and "
            "distribution.hosts to the replicas wanted) or use GPU workers"
        )

    def local_devices(self: Any, cluster_resolver: Any, worker_device: str) -> Any:
        devices, kind = original(self, cluster_resolver, worker_device)
        if kind != "CPU":
            return devices, kind
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(replicas)), kind

    extended._initialize_local_devices = local_devices
    try:
        yield
    finally:
        extended._initialize_local_devices = original


def row_bounds(batch_size: int, replicas: int) -> list[tuple[int, int]]:
    """The [start, end) rows of a global batch each replica trains on."""
    return [(batch_size * i // replicas, batch_size * (i + 1) // replicas) for i in range(replicas)]
