"""Jobs that can be SIGKILLed right after a chosen step, and the specs the replica tests use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins"
KILL_VARIABLE = "REPRO_TEST_SIGKILL_AFTER_STEP"


def make_kill_plugin_site(root: Path) -> list[Path]:
    """Paths that, on PYTHONPATH, register the `killable_mlp` architecture as an entry point."""
    info = root / "reprotrain_kill_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: reprotrain-kill-plugin\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[reprotrain.architectures]\nkillable_mlp = repro_kill_plugin:killable_mlp\n"
    )
    return [root, PLUGIN_DIR]


def replica_spec(replicas: int, *, checkpoint_every_steps: int | None = 10) -> dict[str, Any]:
    """Two epochs of 20 batches of 32 rows, with step trace points and step checkpoints."""
    training: dict[str, Any] = {
        "epochs": 2,
        "optimizer": {"name": "adam", "params": {"learning_rate": 0.01}},
        "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
        "metrics": ["accuracy"],
        "fingerprint_every_steps": 5,
    }
    if checkpoint_every_steps is not None:
        training["checkpoint_every_steps"] = checkpoint_every_steps
    return {
        "name": "replicas",
        "seed": 77,
        "dataset": {
            "generator": "gaussian_blobs",
            "params": {"num_features": 6, "num_classes": 3},
            "batch_size": 32,
            "train_batches": 20,
            "eval_batches": 2,
        },
        "model": {"architecture": "killable_mlp", "params": {"width": 16}},
        "training": training,
        "distribution": {"replicas": replicas},
    }
