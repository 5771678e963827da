"""Progress lines round-trip; the determinism environment is what the spec asks for."""

from __future__ import annotations

import io

from tests.unit.test_spec import BASE
from worker.spec import parse_spec
from worker.training.determinism import environment_mismatch, required_environment
from worker.training.progress import ProgressReporter, parse_line


def test_progress_events_round_trip_and_other_lines_are_ignored() -> None:
    stream = io.StringIO()
    reporter = ProgressReporter(stream, interval=0.0)
    reporter.emit("epoch_end", epoch=2, loss=0.25)
    assert reporter.step_due()
    reporter.step(epoch=2, step=7, loss=0.5)
    lines = stream.getvalue().splitlines()
    assert [parse_line(line) for line in lines] == [
        {"event": "epoch_end", "epoch": 2, "loss": 0.25},
        {"event": "step", "epoch": 2, "step": 7, "loss": 0.5},
    ]
    assert parse_line("2026-11-21 I tensorflow/core: something") is None
    assert parse_line("@repro {not json") is None


def test_step_events_are_rate_limited() -> None:
    reporter = ProgressReporter(io.StringIO(), interval=3600)
    reporter.step(step=1)
    assert not reporter.step_due()


def test_required_environment_follows_the_spec() -> None:
    spec = parse_spec(
        {
            **BASE,
            "determinism": {"intra_op_threads": 2, "inter_op_threads": 1, "python_hash_seed": 5},
        }
    )
    env = required_environment(spec.determinism)
    assert env == {
        "PYTHONHASHSEED": "5",
        "TF_DETERMINISTIC_OPS": "1",
        "OMP_NUM_THREADS": "2",
        "TF_NUM_INTRAOP_THREADS": "2",
        "TF_NUM_INTEROP_THREADS": "1",
    }
    assert environment_mismatch(spec.determinism, env) == {}
    assert environment_mismatch(spec.determinism, {**env, "PYTHONHASHSEED": "0"}) == {
        "PYTHONHASHSEED": ("0", "5")
    }
    off = parse_spec({**BASE, "determinism": {"op_determinism": False}})
    assert "TF_DETERMINISTIC_OPS" not in required_environment(off.determinism)
