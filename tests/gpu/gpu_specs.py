"""The specs (and the one model definition) the GPU suite trains, and the environment its XLA
runs get. Every spec validates with `worker.spec.parse_spec`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.jobs import REPO, blobs_spec
from worker.models.keras_definition import digest_of

RESNET20 = REPO / "examples" / "models" / "resnet20.json"
MIXED_FLOAT16 = "mixed_float16"
# The layer that gives the logits keeps float32, as Keras's mixed-precision guide advises:
# the loss then reads float32 values whatever the policy of the layers before it.
OUTPUT_LAYER = "logits"
IMAGE_CLASSES = 4  # pattern_images has at most four patterns
RESUME_STOP_AFTER_EPOCH = 2  # of resume_spec's four


def _training(epochs: int) -> dict[str, Any]:
    training: dict[str, Any] = {**blobs_spec()["training"], "epochs": epochs}
    return training


def image_dataset(
    *, image_size: int, batch_size: int, train_batches: int, channels: int = 1
) -> dict[str, Any]:
    """Noisy stripe and ring images of `image_size`² pixels, four classes."""
    return {
        "generator": "pattern_images",
        "params": {"image_size": image_size, "channels": channels, "num_classes": IMAGE_CLASSES},
        "batch_size": batch_size,
        "train_batches": train_batches,
    }


def conv_spec(
    name: str,
    *,
    filters: list[int],
    image_size: int = 16,
    channels: int = 1,
    batch_size: int = 32,
    train_batches: int = 4,
    epochs: int = 2,
) -> dict[str, Any]:
    """small_cnn (conv, batch norm, ReLU and pooling blocks of `filters`) on images."""
    return blobs_spec(
        name=name,
        dataset=image_dataset(
            image_size=image_size,
            channels=channels,
            batch_size=batch_size,
            train_batches=train_batches,
        ),
        model={"architecture": "small_cnn", "params": {"filters": filters, "dense": 32}},
        training=_training(epochs),
    )


def attention_spec(name: str, *, epochs: int = 2) -> dict[str, Any]:
    """tiny_transformer (embeddings, self-attention, layer norm) on token sequences."""
    return blobs_spec(
        name=name,
        dataset={
            "generator": "token_sequences",
            "params": {"vocab_size": 24, "seq_len": 16},
            "batch_size": 32,
            "train_batches": 4,
        },
        model={"architecture": "tiny_transformer", "params": {"embed_dim": 16, "ff_dim": 32}},
        training=_training(epochs),
    )


def embedding_control_spec(*, op_determinism: bool) -> dict[str, Any]:
    """A run whose gradients sum thousands of rows into each of a few embedding rows.

    An Embedding's gradient (that of a gather) reaches its table as IndexedSlices, whose
    duplicate rows are summed by UnsortedSegmentSum (or ResourceScatterAdd). On a GPU
    without op determinism both are kernels of float atomicAdds, which add in whatever
    order the threads arrive, and float addition is not associative: with 8 token ids in
    256 x 64 tokens a batch, each row sums about 2,000 values and the rounding changes from
    run to run. Op determinism swaps in sort-then-reduce kernels that add in a fixed order.
    """
    return blobs_spec(
        name="embedding-control",
        dataset={
            "generator": "token_sequences",
            "params": {"vocab_size": 8, "seq_len": 64},
            "batch_size": 256,
            "train_batches": 8,
        },
        model={
            "architecture": "tiny_transformer",
            "params": {"embed_dim": 32, "ff_dim": 64, "dropout": 0.0},
        },
        training=_training(1),
        determinism={"op_determinism": op_determinism},
    )


def resume_spec() -> dict[str, Any]:
    """Four epochs of a conv net: a resumed process picks its cuDNN kernels afresh."""
    return conv_spec("gpu-resume", filters=[8, 16], epochs=4)


def replicas_spec(replicas: int) -> dict[str, Any]:
    """A conv net whose every global batch is split over `replicas` devices."""
    spec = conv_spec(f"gpu-replicas-{replicas}", filters=[8, 16])
    spec["distribution"] = {"replicas": replicas}
    return spec


def hosts_spec(hosts: int, replicas: int) -> dict[str, Any]:
    """The replicas' conv net, each global batch in 2 row shards, over `hosts` processes of
    `replicas` GPUs each."""
    spec = conv_spec(f"gpu-hosts-{hosts}x{replicas}", filters=[8, 16])
    spec["dataset"]["shards"] = 2
    spec["distribution"] = {"hosts": hosts, "replicas": replicas}
    return spec


def autotuned_cnn_spec() -> dict[str, Any]:
    """Convolutions cuDNN autotunes: 3x3 kernels of 64 and 128 channels on 32x32 RGB
    images in batches of 128, so each (forward, data and filter gradient) has several
    algorithms to choose between."""
    return conv_spec(
        "gpu-autotuned-cnn",
        filters=[64, 128, 128],
        image_size=32,
        channels=3,
        batch_size=128,
        train_batches=8,
    )


def xla_environment(dump_dir: Path) -> dict[str, str]:
    """The variables of a run whose compiled steps TensorFlow auto-clusters into XLA
    computations (the spec has no XLA switch for training steps; `dataset.xla` compiles only
    the data generator), with every XLA module dumped in `dump_dir` as evidence."""
    return {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2", "XLA_FLAGS": f"--xla_dump_to={dump_dir}"}


def xla_clusters(dump_dir: Path) -> list[str]:
    """The auto-clustered computations XLA compiled into `dump_dir`, by module name."""
    suffix = ".before_optimizations.txt"
    found = {
        path.name.removesuffix(suffix).split(".", 1)[1]
        for path in dump_dir.glob(f"module_*.cluster_*{suffix}")
    }
    return sorted(found)


def mixed_precision_definition(policy: str = MIXED_FLOAT16) -> bytes:
    """ResNet-20 (examples/models) for four classes, every layer but the logits under the
    dtype policy `policy`: with `mixed_float16` its variables stay float32 and it computes
    in float16, as Keras builds a model under `keras.config.set_dtype_policy`."""
    config: dict[str, Any] = json.loads(RESNET20.read_text())
    for layer in config["config"]["layers"]:
        settings = layer["config"]
        if layer["class_name"] == "InputLayer":
            continue
        if settings["name"] == OUTPUT_LAYER:
            settings["units"] = IMAGE_CLASSES
            continue
        settings["dtype"]["config"]["name"] = policy
    return json.dumps(config, indent=1).encode()


def mixed_precision_spec(definition: bytes) -> dict[str, Any]:
    """A run of the model definition `definition` (given to the job with --model-file) on
    32x32 RGB images."""
    return blobs_spec(
        name="gpu-mixed-precision",
        dataset=image_dataset(image_size=32, channels=3, batch_size=64, train_batches=4),
        model={"architecture": "keras", "definition": digest_of(definition)},
        training=_training(2),
    )
