"""`training.steps_per_execution`: several optimizer steps per compiled call, in a loop.

Reruns of one spec are bitwise identical, however its calls are cut: finer trace points
or a resume from a step checkpoint split the calls elsewhere and change no bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import run_job
from worker.result import JobResult

pytestmark = pytest.mark.slow


def _spec(steps_per_execution: int) -> dict[str, Any]:
    """A small transformer with dropout: the model whose bits an unrolled loop once changed."""
    return {
        "name": "looped-steps",
        "seed": [7, 0],
        "dataset": {
            "generator": "token_sequences",
            "params": {"vocab_size": 32, "seq_len": 16, "num_classes": 2},
            "batch_size": 16,
            "train_batches": 12,
            "eval_batches": 2,
        },
        "model": {
            "architecture": "tiny_transformer",
            "params": {"embed_dim": 16, "num_heads": 2, "ff_dim": 32, "dropout": 0.1},
        },
        "training": {
            "epochs": 2,
            "optimizer": {"name": "adamw", "params": {"learning_rate": 0.002}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
            "checkpoint_every_steps": 9,
            "steps_per_execution": steps_per_execution,
        },
        "determinism": {"intra_op_threads": 1, "inter_op_threads": 1},
    }


def _metrics(result: JobResult) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in result.metrics]


def _same(a: JobResult, b: JobResult) -> None:
    assert a.status == b.status == "succeeded", (a.error, b.error)
    assert b.final_fingerprint == a.final_fingerprint
    assert b.data_fingerprints == a.data_fingerprints
    assert _metrics(b) == _metrics(a)


def test_steps_per_execution_reruns_bitwise_however_calls_are_cut(tmp_path: Path) -> None:
    spec = _spec(5)
    first = run_job(spec, tmp_path / "a", "--checkpoint-dir", str(tmp_path / "ckpt")).result
    assert first.status == "succeeded", first.error
    # Calls of 5 cut at step checkpoints (9, 18) and epoch ends (12, 24): 5 4 3 | 5 1 5 1.
    assert first.timings["train_calls"] == 7
    assert [p.step for p in first.trace] == [0, 12, 24]

    again = run_job(spec, tmp_path / "b").result
    _same(first, again)
    assert again.trace == first.trace

    # A trace point every 2 steps cuts every call at 2 steps: the same bits at every epoch end.
    fine = run_job(spec, tmp_path / "c", "--trace-every-steps", "2").result
    _same(first, fine)
    assert [p for p in fine.trace if p.kind != "step"] == first.trace
    assert fine.timings["train_calls"] == 12

    # Resume mid-epoch 2 from the step-18 checkpoint: the later ones are gone.
    ckpt = tmp_path / "ckpt"
    for path in ckpt.iterdir():
        if not path.name.startswith(("step-000000009", "step-000000018", "epoch-000001")):
            path.unlink()
    resumed = run_job(spec, tmp_path / "d", "--checkpoint-dir", str(ckpt), "--resume").result
    assert resumed.resumed_from_step == 18
    _same(first, resumed)
    assert resumed.trace == first.trace


def test_one_step_per_execution_is_the_spec_as_it_always_was(tmp_path: Path) -> None:
    """N = 1 leaves the spec's hash as before the field existed, and runs one step a call."""
    spec = _spec(1)
    without = _spec(1)
    del without["training"]["steps_per_execution"]
    one = run_job(spec, tmp_path / "one").result
    plain = run_job(without, tmp_path / "plain").result
    assert one.spec_hash == plain.spec_hash
    assert one.timings["train_calls"] == 24
    _same(plain, one)
    assert one.trace == plain.trace
    looped = run_job(_spec(5), tmp_path / "looped").result
    assert looped.spec_hash != one.spec_hash
    assert looped.status == "succeeded", looped.error
    # One step a call fingerprints the data as it is consumed, calls of several steps by
    # generating it again: the same values.
    assert looped.data_fingerprints == one.data_fingerprints
    # Both take them as the batches are consumed; the classic loop generates them again.
    classic = run_job(spec, tmp_path / "classic", "--classic-loop").result
    assert looped.data_fingerprints == classic.data_fingerprints
    assert looped.eval_data_fingerprint == one.eval_data_fingerprint
    assert one.eval_data_fingerprint == classic.eval_data_fingerprint
    # Each compiles what its epochs call, and the evaluation step, once: the pre-flight and
    # the check for stateful RNG ops use those traces. The loop traces the single step
    # inside it, but never compiles it on its own as well.
    assert one.timings["traces"] == 2
    assert looped.timings["traces"] == 3
