"""The one place that controls every source of randomness and scheduling in a job.

Some settings only work before the interpreter or the TensorFlow runtime starts
(PYTHONHASHSEED, OpenMP threads), so `required_environment` says what the job process
must be started with and `apply` checks it, then sets the rest and returns a record.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Mapping
from typing import Any

from worker.errors import DeterminismError
from worker.spec import DeterminismSpec
from worker.training.seeds import SeedTuple, derive_int_seed


def required_environment(spec: DeterminismSpec) -> dict[str, str]:
    """Environment variables the job process must be started with."""
    env = {"PYTHONHASHSEED": str(spec.python_hash_seed)}
    if spec.op_determinism:
        env["TF_DETERMINISTIC_OPS"] = "1"
    if spec.intra_op_threads is not None:
        env["OMP_NUM_THREADS"] = str(spec.intra_op_threads)
        env["TF_NUM_INTRAOP_THREADS"] = str(spec.intra_op_threads)
    if spec.inter_op_threads is not None:
        env["TF_NUM_INTEROP_THREADS"] = str(spec.inter_op_threads)
    return env


def environment_mismatch(
    spec: DeterminismSpec, environ: Mapping[str, str] | None = None
) -> dict[str, tuple[str | None, str]]:
    """Variables whose current value differs from the required one: name -> (now, needed)."""
    environ = os.environ if environ is None else environ
    return {
        name: (environ.get(name), value)
        for name, value in required_environment(spec).items()
        if environ.get(name) != value
    }


def reseed(seed: SeedTuple, *keys: int | str, tensorflow: bool = True) -> int:
    """Seed Python, NumPy, TensorFlow and Keras from (seed, keys); returns the int used.

    Called at start-up and at the start of every epoch, so an epoch's randomness depends
    on (seed, epoch) only, and a job resumed at epoch k draws what it would have drawn.
    `tensorflow=False` leaves TensorFlow's global seed alone: setting it clears the
    runtime's caches, so every compiled step is optimised again, and it only matters to
    stateful random ops (whose sequences it restarts), which the job checks for.
    """
    import keras

    value = derive_int_seed(seed, *keys)
    if tensorflow:
        keras.utils.set_random_seed(value)  # random, numpy.random, tf.random and Keras
        return value
    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils

    # What keras.utils.set_random_seed does, but for tf.random.set_seed.
    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, value)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(value)
    np.random.seed(value)
    return value


def rng_state() -> dict[str, Any]:
    """The process-global RNG states a step checkpoint keeps, as JSON-safe values.

    Epoch starts reseed everything from (seed, epoch), so only a resume in mid-epoch needs
    these: Python's `random`, NumPy's global generator and Keras's global SeedGenerator
    (used by `keras.random` calls without a seed; absent until something draws from it).
    Layer seed generators are model variables and travel with the checkpoint's arrays.
    """
    import numpy as np
    from keras.src.backend.common import global_state

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    generator = global_state.get_global_attribute("global_seed_generator")
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
        "keras_global_seed_generator": (
            None if generator is None else np.asarray(generator.state.numpy()).tolist()
        ),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what `rng_state` recorded."""
    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import global_seed_generator

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    saved = state.get("keras_global_seed_generator")
    if saved is None:
        global_state.set_global_attribute("global_seed_generator", None)
    else:
        generator = global_seed_generator()
        generator.state.assign(np.asarray(saved, dtype=generator.state.dtype))


def apply(spec: DeterminismSpec, seed: SeedTuple) -> dict[str, Any]:
    """Set up this process for deterministic training and return what was set.

    Must run before TensorFlow executes its first op (thread pools are fixed then).
    """
    check_started_with(spec)
    return configure(spec, seed)


def check_started_with(spec: DeterminismSpec) -> None:
    """DeterminismError unless the process started with `required_environment(spec)`."""
    mismatch = environment_mismatch(spec)
    if mismatch:
        detail = ", ".join(f"{k}={now!r} (needs {need!r})" for k, (now, need) in mismatch.items())
        raise DeterminismError(
            f"the job process was not started with its determinism environment: {detail}; "
            "run jobs through `python -m worker.run`, which sets it"
        )
    # The variable only counts if it was there when the interpreter started.
    if bool(sys.flags.hash_randomization) != (spec.python_hash_seed != 0):
        raise DeterminismError(
            "PYTHONHASHSEED was changed after the interpreter started; start a fresh process"
        )


def configure(spec: DeterminismSpec, seed: SeedTuple) -> dict[str, Any]:
    """Set TensorFlow's threads, op determinism and TF32 and seed every generator; what
    was set. `apply` checks the process's start-up environment first."""
    import tensorflow as tf

    if spec.intra_op_threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(spec.intra_op_threads)
    if spec.inter_op_threads is not None:
        tf.config.threading.set_inter_op_parallelism_threads(spec.inter_op_threads)
    if spec.op_determinism:
        tf.config.experimental.enable_op_determinism()
    if spec.tf32 is not None:
        tf.config.experimental.enable_tensor_float_32_execution(spec.tf32)
    random.seed(derive_int_seed(seed, "python"))
    init_seed = reseed(seed, "init")
    return {
        "python_hash_seed": os.environ.get("PYTHONHASHSEED"),
        "hash_randomization": bool(sys.flags.hash_randomization),
        "op_determinism": spec.op_determinism,
        # What TensorFlow will do (its default when the spec leaves it null); it only acts
        # on Ampere and newer GPUs, and NVIDIA_TF32_OVERRIDE=0 in the environment wins over it.
        "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
        "tf_deterministic_ops_env": os.environ.get("TF_DETERMINISTIC_OPS"),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "seeded": ["python.random", "numpy.random", "tf.random", "keras"],
        "init_seed": init_seed,
        "reseed": "every epoch from (seed, 'epoch', epoch)",
        "seed": list(seed),
    }
