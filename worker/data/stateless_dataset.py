"""StatelessRngDataset: finite tf.data datasets generated on the fly from stateless seeds.

Batch `b` of epoch `e` gets the seed fold_in(fold_in(base, e)[, shard], b) and the
generator is called as `batch_generator(indices, seed)`. Nothing depends on call order,
so parallel map and prefetch change at most the emission order, never the values.

With `row_shards` S > 1 a batch is S equal shards of rows, shard k generated from the
seed fold_in(batch seed, k) and its own indices: a dataset of some of them (`own_shards`)
gives exactly those rows of the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from worker.errors import GeneratorError
from worker.record.fingerprint import DEFAULT_ALGORITHM, StreamDigest
from worker.training.seeds import SeedTuple, resolve_seed

AUTOTUNE = tf.data.AUTOTUNE
_SEED_SPEC = tf.TensorSpec([2], tf.int64, name="seed")

# Op types that draw from hidden RNG state; any of them breaks the per-batch guarantee.
_STATEFUL_RANDOM_OPS = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "ParameterizedTruncatedNormal",
        "RandomShuffle",
        "RandomGamma",
        "RandomGammaGrad",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomCrop",
        "Multinomial",
        "StatefulUniform",
        "StatefulUniformInt",
        "StatefulUniformFullInt",
        "StatefulStandardNormal",
        "StatefulStandardNormalV2",
        "StatefulTruncatedNormal",
        "StatefulRandomBinomial",
        "RngSkip",
        "RngReadAndSkip",
        "NonDeterministicInts",
        # Not "RandomIndexShuffle": despite its name it is a pure function of (index, seed,
        # max_index) (its op def is not stateful) and is how index_shuffle permutes ids.
        "ExperimentalRandomDataset",
        "RandomDataset",
    }
)


def stateful_random_ops_in(graph_def: Any) -> list[str]:
    """The stateful RNG op types in a graph and its function library."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return sorted({n.op for n in nodes if n.op in _STATEFUL_RANDOM_OPS})


class StatelessRngDataset:
    """Factory of a finite dataset whose batch `b` is `batch_generator(indices, seed_b)`."""

    def __init__(
        self,
        batch_generator: Callable[[tf.Tensor, tf.Tensor], Any],
        *,
        batch_size: int,
        num_batches: int,
        base_seed: int | tuple[int, int] | None = None,
        num_parallel_calls: int | None = AUTOTUNE,
        prefetch_buffer: int | None = AUTOTUNE,
        deterministic_order: bool = False,
        xla_compile_generator: bool = False,
        assert_cardinality: bool = False,
        epoch: int = 0,
        shard_key: int | None = None,
        stream: int = 0,
        forbid_stateful_rng: bool = False,
        name: str | None = None,
        pass_epoch_seed: bool = False,
        row_shards: int = 1,
        own_shards: tuple[int, int] | None = None,
        _traced: tuple[Any, list[str], Any] | None = None,
    ) -> None:
        if batch_size < 1 or num_batches < 1:
            raise ValueError("batch_size and num_batches must be positive")
        if epoch < 0 or stream < 0 or (shard_key is not None and shard_key < 0):
            raise ValueError("epoch, stream and shard_key must be non-negative")
        if row_shards < 1 or batch_size % row_shards:
            raise ValueError(f"batch_size {batch_size} is not {row_shards} equal row shards")
        first, end = own_shards or (0, row_shards)
        if not 0 <= first < end <= row_shards:
            raise ValueError(f"own_shards {own_shards} is not a range of {row_shards} shards")
        self.batch_size = int(batch_size)
        self.num_batches = int(num_batches)
        self.row_shards = int(row_shards)
        self.own_shards = (first, end)
        self.num_parallel_calls = num_parallel_calls
        self.prefetch_buffer = prefetch_buffer
        self.deterministic_order = deterministic_order
        self.xla_compile_generator = xla_compile_generator
        self.assert_cardinality = assert_cardinality
        self.epoch = int(epoch)
        self.shard_key = shard_key
        self.stream = int(stream)
        self.name: str = name or str(getattr(batch_generator, "__name__", "batch_generator"))
        self._raw_generator = batch_generator
        self._seed: SeedTuple = resolve_seed(base_seed)
        # A generator that shuffles per epoch also gets the epoch's seed (BatchSource).
        self.pass_epoch_seed = pass_epoch_seed
        if _traced is not None:
            # A copy for another epoch, shard or stream (`_replace`): the same generator,
            # already traced and inspected. Tracing it again cost a small CNN's job about
            # a tenth of each epoch.
            self._generator, self.stateful_random_ops, self.output_spec = _traced
        else:
            epoch_spec = (
                [tf.TensorSpec([2], tf.int64, name="epoch_seed")] if pass_epoch_seed else []
            )
            self._generator = tf.function(
                batch_generator,
                input_signature=[
                    tf.TensorSpec([None], tf.int64, name="indices"),
                    _SEED_SPEC,
                    *epoch_spec,
                ],
                jit_compile=xla_compile_generator,
                reduce_retracing=True,
            )
            self.stateful_random_ops, self.output_spec = self._inspect()
        if self.stateful_random_ops and forbid_stateful_rng:
            raise GeneratorError(
                self.name,
                f"uses stateful RNG ops ({', '.join(self.stateful_random_ops)}) while op "
                "determinism is on; use tf.random.stateless_* with the seed it is given",
            )
        self._prefix_seed = self._derive_prefix_seed()

    def _inspect(self) -> tuple[list[str], Any]:
        """Trace the generator once: check its output structure, find stateful RNG ops, and
        give a batch's structure of TensorSpecs (the leading dimension unknown)."""
        try:
            concrete = self._generator.get_concrete_function()
        except Exception as exc:
            raise GeneratorError(self.name, f"cannot be traced as a tf.function: {exc}") from exc
        ops = stateful_random_ops_in(concrete.graph.as_graph_def())
        leaves = tf.nest.flatten(concrete.structured_outputs)
        if not leaves:
            raise GeneratorError(self.name, "returned no tensors")
        for leaf in leaves:
            if not isinstance(leaf, tf.Tensor):
                raise GeneratorError(self.name, f"returned a {type(leaf).__name__}, not tensors")
            if leaf.shape.rank == 0:
                raise GeneratorError(
                    self.name,
                    f"returned a scalar {leaf.dtype.name}; every output needs a "
                    "leading batch dimension",
                )
        spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype), concrete.structured_outputs
        )
        return ops, spec

    def _derive_prefix_seed(self) -> np.ndarray:
        # Everything but the batch id is fixed per dataset: fold it once, outside the map.
        seed = tf.constant(self._seed, tf.int64)
        keys = [self.epoch] + ([self.shard_key] if self.shard_key is not None else [])
        if self.stream:
            keys.insert(0, self.stream)
        for key in keys:
            seed = tf.random.experimental.stateless_fold_in(seed, tf.constant(key, tf.int64))
        return np.asarray(seed.numpy(), dtype=np.int64)

    def resolved_seed_tuple(self) -> SeedTuple:
        """The base seed in use (random when None was given): log it to rerun exactly."""
        return self._seed

    def for_epoch(self, epoch: int) -> StatelessRngDataset:
        """The same factory for another epoch."""
        return self._replace(epoch=epoch)

    def with_options(self, **changes: Any) -> StatelessRngDataset:
        """A copy with some constructor arguments changed; the base seed stays."""
        return self._replace(**changes)

    def _replace(self, **changes: Any) -> StatelessRngDataset:
        args: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_batches": self.num_batches,
            "base_seed": self._seed,
            "num_parallel_calls": self.num_parallel_calls,
            "prefetch_buffer": self.prefetch_buffer,
            "deterministic_order": self.deterministic_order,
            "xla_compile_generator": self.xla_compile_generator,
            "assert_cardinality": self.assert_cardinality,
            "epoch": self.epoch,
            "shard_key": self.shard_key,
            "stream": self.stream,
            "name": self.name,
            "pass_epoch_seed": self.pass_epoch_seed,
            "row_shards": self.row_shards,
            "own_shards": self.own_shards,
        }
        args.update(changes)
        if (args["xla_compile_generator"], args["pass_epoch_seed"]) == (
            self.xla_compile_generator,
            self.pass_epoch_seed,
        ):
            args["_traced"] = (self._generator, self.stateful_random_ops, self.output_spec)
        return StatelessRngDataset(self._raw_generator, **args)

    def batch_seed(self, batch_id: int | tf.Tensor) -> tf.Tensor:
        """The `[2]` int64 stateless seed of one batch."""
        return tf.random.experimental.stateless_fold_in(
            tf.constant(self._prefix_seed), tf.cast(batch_id, tf.int64)
        )

    def make_batch(self, batch_id: int | tf.Tensor) -> Any:
        """The values of one batch, computed directly (equal to the dataset's element)."""
        return self._batch(tf.constant(self._prefix_seed), tf.cast(batch_id, tf.int64))

    @property
    def rows(self) -> int:
        """The rows of each batch this dataset gives: its own shards' (all by default)."""
        first, end = self.own_shards
        return self.batch_size // self.row_shards * (end - first)

    def _batch(self, prefix_seed: tf.Tensor, batch_id: tf.Tensor) -> Any:
        """Batch `batch_id` (int64) of the epoch whose prefix seed is `prefix_seed` (its own
        shards' rows)."""
        seed = tf.random.experimental.stateless_fold_in(prefix_seed, batch_id)
        if self.row_shards == 1:
            return self._rows(batch_id * self.batch_size, self.batch_size, seed, prefix_seed)
        per_shard = self.batch_size // self.row_shards
        parts = [
            self._rows(
                batch_id * self.batch_size + k * per_shard,
                per_shard,
                tf.random.experimental.stateless_fold_in(seed, tf.constant(k, tf.int64)),
                prefix_seed,
            )
            for k in range(*self.own_shards)
        ]
        return tf.nest.map_structure(lambda *leaves: tf.concat(leaves, axis=0), *parts)

    def _rows(self, start: Any, count: int, seed: tf.Tensor, prefix_seed: tf.Tensor) -> Any:
        """The generator's `count` rows from index `start`, checked to be that many."""
        indices = tf.range(start, start + count, dtype=tf.int64)
        out = (
            self._generator(indices, seed, prefix_seed)
            if self.pass_epoch_seed
            else self._generator(indices, seed)
        )
        if self.row_shards == 1:
            return out
        message = (
            f"generator {self.name!r} must return one row per index it is given: a batch "
            f"split into {self.row_shards} row shards asks for {count} rows at a time"
        )

        def counted(leaf: tf.Tensor) -> tf.Tensor:
            rows = tf.shape(leaf)[0]
            with tf.control_dependencies([tf.debugging.assert_equal(rows, count, message)]):
                return tf.identity(leaf)

        return tf.nest.map_structure(counted, out)

    def as_dataset(self) -> tf.data.Dataset:
        """The tf.data pipeline: range of batch ids → parallel generator map → prefetch."""
        ids = tf.data.Dataset.range(self.num_batches, name="batch_ids")
        return self._pipeline(ids, self.make_batch, self.num_batches)

    def epochs_dataset(
        self, first_epoch: int, last_epoch: int, first_batch: int = 0
    ) -> tf.data.Dataset:
        """Epochs `first_epoch`..`last_epoch` in one pipeline, from batch `first_batch` of
        the first: each epoch's batches, in order, equal those of `for_epoch(e)`.

        One pipeline is traced and started once for a whole run, where a dataset per epoch
        traced its map function and built its iterator anew every epoch (about 40 ms an
        epoch, a sixth of a small CNN's). Its element for position p is batch p mod
        `num_batches` of epoch p div `num_batches` (counted from `first_epoch`), with that
        epoch's prefix seed taken from a table. Use it only with `deterministic_order` or
        a serial map: otherwise batches could cross from one epoch into the next.
        """
        if not 0 <= first_epoch <= last_epoch:
            raise ValueError("need 0 <= first_epoch <= last_epoch")
        if not 0 <= first_batch < self.num_batches:
            raise ValueError(f"first_batch must be in [0, {self.num_batches})")
        n = self.num_batches
        prefixes = tf.constant(
            np.stack([self.for_epoch(e)._prefix_seed for e in range(first_epoch, last_epoch + 1)])
        )

        def make(position: tf.Tensor) -> Any:
            return self._batch(tf.gather(prefixes, position // n), position % n)

        end = (last_epoch - first_epoch + 1) * n
        positions = tf.data.Dataset.range(first_batch, end, name="batch_positions")
        return self._pipeline(positions, make, end - first_batch)

    def _pipeline(
        self, ids: tf.data.Dataset, make: Callable[[tf.Tensor], Any], count: int
    ) -> tf.data.Dataset:
        ds = ids.map(
            make,
            num_parallel_calls=self.num_parallel_calls,
            # Serial maps are ordered anyway, and tf.data warns if told so.
            deterministic=self.deterministic_order if self.num_parallel_calls else None,
            name="generate",
        )
        if self.assert_cardinality:
            ds = ds.apply(tf.data.experimental.assert_cardinality(count))
        if self.prefetch_buffer:
            ds = ds.prefetch(self.prefetch_buffer)
        return ds

    def iter_batches_in_order(self) -> Iterator[Any]:
        """Every batch in batch-id order, as NumPy, however the pipeline is configured."""
        ds = self.with_options(deterministic_order=True).as_dataset()
        yield from ds.as_numpy_iterator()

    def data_fingerprint(self, algorithm: str = DEFAULT_ALGORITHM) -> str:
        """A digest of every value of every batch, in batch-id order."""
        ds = self.with_options(deterministic_order=True).as_dataset()
        digest = StreamDigest(algorithm)
        _digest_batches(ds, self.num_batches, [digest])
        return digest.hexdigest()

    def epochs_data_fingerprints(
        self, first_epoch: int, last_epoch: int, algorithm: str = DEFAULT_ALGORITHM
    ) -> list[str]:
        """`for_epoch(e).data_fingerprint()` for each epoch e of first..last, from one
        pipeline: a dataset per epoch cost about as much again to build and start."""
        ordered = self.with_options(deterministic_order=True)
        ds = ordered.epochs_dataset(first_epoch, last_epoch)
        digests = [StreamDigest(algorithm) for _ in range(first_epoch, last_epoch + 1)]
        _digest_batches(ds, self.num_batches, digests)
        return [d.hexdigest() for d in digests]


# Batches are fetched this many bytes at a time, stacked: a Python `next` per batch cost
# more than generating it for small batches.
_FINGERPRINT_CHUNK_BYTES = 8 << 20
_FINGERPRINT_CHUNK_BATCHES = 256


def _digest_batches(ds: tf.data.Dataset, per_digest: int, digests: list[StreamDigest]) -> None:
    """Feed `digests` (one per `per_digest` consecutive batches of `ds`) every batch's
    leaves, named `<batch id>/<leaf id>`; the values are the batches' own, whether they were
    fetched one by one or stacked."""
    specs = tf.nest.flatten(ds.element_spec)
    chunk = 1
    if all(spec.shape.is_fully_defined() for spec in specs):
        batch_bytes = max(1, sum(spec.shape.num_elements() * spec.dtype.size for spec in specs))
        chunk = max(1, min(_FINGERPRINT_CHUNK_BATCHES, _FINGERPRINT_CHUNK_BYTES // batch_bytes))
    position = 0
    for element in (ds.batch(chunk) if chunk > 1 else ds).as_numpy_iterator():
        leaves = [np.asarray(leaf) for leaf in tf.nest.flatten(element)]
        batches = [[leaf[i] for leaf in leaves] for i in range(len(leaves[0]))]
        for batch in batches if chunk > 1 else [leaves]:
            digests[position // per_digest].add_batch(position % per_digest, batch)
            position += 1
