"""How a spot check samples a run's segments, what it claims the sample proves, and which
epoch checkpoints each retention policy keeps."""

from __future__ import annotations

import math

import pytest

from service.runs.resume_points import kept_positions
from service.verification.spot_checks import (
    Point,
    Segment,
    catch_chance,
    pick_segments,
    segments_of,
)

START = Point("epoch", 0, 0)


def test_segments_run_between_kept_checkpoints_from_the_start() -> None:
    e2, e4, e5 = Point("epoch", 2, 20), Point("epoch", 4, 40), Point("epoch", 5, 50)
    assert segments_of([e2, e4, e5]) == [
        Segment(0, START, e2),
        Segment(1, e2, e4),
        Segment(2, e4, e5),
    ]
    assert segments_of([]) == []


def test_step_checkpoints_split_epochs_and_an_epoch_checkpoint_wins_at_one_step() -> None:
    # 40 steps an epoch, step checkpoints every 15: 15, 30, 45, 60, 75 and epoch ends 40, 80.
    steps = [Point("step", s // 40, s) for s in (15, 30, 45, 60, 75, 80)]
    ends = [Point("epoch", 1, 40), Point("epoch", 2, 80)]
    found = segments_of(sorted([*steps, *ends], key=lambda p: p.step))
    assert [(s.start.step, s.end.step) for s in found] == [
        (0, 15), (15, 30), (30, 40), (40, 45), (45, 60), (60, 75), (75, 80)
    ]  # fmt: skip
    assert found[-1].end == Point("epoch", 2, 80)
    assert found[2].record() == {
        "index": 2, "from_epoch": 0, "to_epoch": 1, "from_step": 30, "to_step": 40,
        "from_kind": "step", "to_kind": "epoch",
    }  # fmt: skip


def test_the_same_seed_picks_the_same_segments_and_seeds_spread_the_choice() -> None:
    assert pick_segments(10, 3, 42) == pick_segments(10, 3, 42)
    picks = [tuple(pick_segments(10, 3, seed)) for seed in range(200)]
    assert all(len(set(p)) == 3 and list(p) == sorted(p) for p in picks)
    # Every segment gets picked by some seed, about 3 in 10 times.
    counts = [sum(i in p for p in picks) for i in range(10)]
    assert min(counts) > 30 and max(counts) < 90, counts
    assert pick_segments(2, 5, 1) == [0, 1]  # more asked than there are: all of them


@pytest.mark.parametrize(("n", "k", "bad"), [(10, 3, 1), (10, 3, 5), (40, 4, 4), (100, 3, 50)])
def test_the_stated_catch_chance_never_overstates_sampling_without_replacement(
    n: int, k: int, bad: int
) -> None:
    exact = 1 - math.comb(n - bad, k) / math.comb(n, k)
    assert catch_chance(k, bad / n) <= exact + 1e-12
    assert catch_chance(3, 0.1) == pytest.approx(1 - 0.9**3)
    assert catch_chance(3, 0.5) == pytest.approx(0.875)


def test_retention_policies() -> None:
    assert kept_positions(7, "all") == set(range(7))
    assert kept_positions(7, "final") == {6}
    assert kept_positions(7, "every:3") == {2, 5, 6}  # epochs 3, 6 and the last
    assert kept_positions(7, "every:1") == set(range(7))
    assert kept_positions(0, "final") == set()


def test_a_check_of_every_segment_is_certain_not_at_least_a_chance() -> None:
    """Replaying all segments once still said "a chance of at least 41%"."""
    from service.verification.spot_check_reports import _explain

    rows = [{"same_worker": False} for _ in range(5)]
    every = _explain("identical", rows, None, [], [], total=5)
    assert "every segment was checked" in every and "chance" not in every
    some = _explain("identical", rows[:2], None, [], [], total=5)
    assert "2 of the run's 5 segments" in some and "chance of at least 19%" in some
