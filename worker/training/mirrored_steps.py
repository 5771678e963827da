"""The compiled train and eval steps of a job trained over N > 1 replicas."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from worker.training.replicas import Placement, row_bounds

UpdateMetrics = Callable[[Any, Any, Any], None]


class MirroredSteps:
    """Data-parallel steps: replica i trains on rows [B*i//N, B*(i+1)//N) of each global batch.

    Over several hosts, N is every host's replicas together and `x`, `y` are only this
    host's rows of the global batch; the outputs and labels are gathered from every host so
    the metrics see the whole global batch, as with one host.

    Each replica's loss is its per-element losses summed over the global batch's element
    count (plus 1/N of the regularisation losses), so the all-reduced (summed) gradients
    are the global batch's, as with one replica, up to the order of the additions. Keras's
    own reduction would divide by the replica's rows and then by N: wrong for uneven splits.
    """

    def __init__(
        self,
        *,
        placement: Placement,
        model: keras.Model,
        optimizer: Any,
        make_loss: Callable[[str | None], Any],
        batch_size: int,
        update_train_metrics: UpdateMetrics,
        eval_step: Callable[[Any, Any], None],
        outputs_read: bool = True,
    ) -> None:
        self.placement, self.model, self.optimizer = placement, model, optimizer
        self.loss_values = make_loss("none")
        self.reduction = str(make_loss(None).reduction)
        self.batch_size = batch_size
        # This host's replicas' rows, counted from its own first row.
        first_row = placement.host_rows(batch_size)[0]
        local = slice(placement.first_replica, placement.first_replica + placement.replicas)
        self.bounds: Sequence[tuple[int, int]] = [
            (a - first_row, b - first_row)
            for a, b in row_bounds(batch_size, placement.total_replicas)[local]
        ]
        self._update_train_metrics = update_train_metrics
        # Whether the training metrics read the outputs and labels, beyond the loss.
        self.outputs_read = outputs_read
        self._eval_step = eval_step

    def _replica_step(self, x: Any, y: Any) -> tuple[tf.Tensor, Any]:
        replicas = self.placement.total_replicas
        with tf.GradientTape() as tape:
            out = self.model(x, training=True)
            values = self.loss_values(y, out)
            total = tf.reduce_sum(values)
            if values.shape.rank == 0:  # already a per-replica mean
                loss = total / replicas
            elif self.reduction == "sum":
                loss = total
            else:  # the mean over every element of the global batch
                per_row = tf.size(values) // tf.shape(values)[0]
                loss = total / tf.cast(per_row * self.batch_size, total.dtype)
            if self.model.losses:
                loss += tf.add_n(self.model.losses) / replicas
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return loss, out

    def train_step(self, x: Any, y: Any) -> tf.Tensor:
        """One global step; returns the global batch's loss."""
        strategy = self.placement.strategy
        first = self.placement.first_replica

        def split(t: Any) -> Any:
            parts = [tf.nest.map_structure(lambda v, a=a, b=b: v[a:b], t) for a, b in self.bounds]
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: parts[ctx.replica_id_in_sync_group - first]
            )

        ys = split(y)
        losses, outs = strategy.run(self._replica_step, args=(split(x), ys))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        if self.placement.hosts > 1 and not self.outputs_read:
            out = y = None  # the loss alone: nothing to gather from the other hosts
        elif self.placement.hosts > 1:  # every host's rows, in global replica order
            out = tf.nest.map_structure(lambda v: strategy.gather(v, axis=0), outs)
            y = tf.nest.map_structure(lambda v: strategy.gather(v, axis=0), ys)
        else:
            out = tf.nest.map_structure(
                lambda *parts: tf.concat(parts, axis=0), *strategy.experimental_local_results(outs)
            )
        # Metrics see the whole global batch at once, exactly as with one replica.
        self._update_train_metrics(loss, y, out)
        return loss

    def eval_step(self, x: Any, y: Any) -> None:
        """Evaluation, unreplicated on the first device.

        It reads the first replica's copy of per-replica state: BatchNormalization's moving
        statistics are updated by each replica from its own rows and not synchronised.
        """
        with tf.device(self.placement.devices[0]):
            self._eval_step(x, y)
