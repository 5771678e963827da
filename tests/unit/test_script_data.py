"""How a script's consumed batches become per-epoch data fingerprints: one batch per
optimizer step, in the order the input pipeline made them, so batches made ahead of time
(a prefetch) count in the epoch whose steps train on them."""

from __future__ import annotations

import numpy as np

from worker.record.fingerprint import StreamDigest
from worker.script.data import ConsumedData


def _batches(data: ConsumedData, values: list[int]) -> None:
    for v in values:
        data.add_batch([np.full((2, 3), v, dtype=np.float32), np.array([v, v], dtype=np.int32)])


def _epochs(values_per_epoch: list[list[int]], *, ahead: int = 0) -> list[str | None]:
    """Fingerprints of epochs of the given batches, with `ahead` batches of the next epoch
    made before each epoch ends."""
    data = ConsumedData()
    flat = [v for epoch in values_per_epoch for v in epoch]
    step, made, out = 0, 0, []
    for epoch, values in enumerate(values_per_epoch, start=1):
        step += len(values)
        upto = min(len(flat), step + ahead)
        _batches(data, flat[made:upto])
        made = upto
        fingerprint, warning = data.end_epoch(epoch, step)
        assert warning is None
        out.append(fingerprint)
    return out


def test_an_epochs_fingerprint_is_its_own_batches_in_order_whatever_was_made_ahead() -> None:
    plain = _epochs([[1, 2, 3], [4, 5, 6]])
    prefetched = _epochs([[1, 2, 3], [4, 5, 6]], ahead=2)
    assert plain == prefetched
    assert plain[0] != plain[1]
    assert _epochs([[1, 2, 3], [4, 6, 5]])[0] == plain[0]  # epoch 1 still the same
    assert _epochs([[1, 2, 3], [4, 6, 5]])[1] != plain[1]  # order counts
    assert _epochs([[1, 2, 9], [4, 5, 6]])[0] != plain[0]


def test_step_trace_points_take_batches_as_they_go_and_a_resume_skips_the_done_steps() -> None:
    whole = ConsumedData()
    _batches(whole, [1, 2, 3, 4])
    whole.advance(2)  # a step trace point mid-epoch
    assert whole.end_epoch(1, 4) == (_epochs([[1, 2, 3, 4]])[0], None)
    resumed = ConsumedData()
    resumed.resume_at(4)  # epoch 1 came from the checkpoint
    _batches(resumed, [5, 6])
    fingerprint, _ = resumed.end_epoch(2, 6)
    assert fingerprint == _epochs([[1, 2, 3, 4], [5, 6]])[1]


def test_steps_without_their_batches_leave_the_epoch_out_with_a_warning() -> None:
    data = ConsumedData()
    _batches(data, [1, 2])
    fingerprint, warning = data.end_epoch(3, 5)
    assert fingerprint is None
    assert warning is not None and "epoch 3 trained 5 steps but run.dataset() saw 2" in warning


def test_arrays_given_whole_stand_for_every_epoch_that_wrapped_nothing() -> None:
    data = ConsumedData()
    assert data.end_epoch(1, 10) == (None, None)  # nothing wrapped, nothing given
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    data.add_whole([x, np.arange(4)])
    first, _ = data.end_epoch(1, 10)
    second, _ = data.end_epoch(2, 20)
    assert first is not None and first.startswith("arrays:") and first == second
    data.add_whole([x + 1, np.arange(4)])
    assert data.end_epoch(3, 30)[0] != first


def test_string_leaves_are_digested_by_their_bytes() -> None:
    def digest(items: list[bytes]) -> str:
        d = StreamDigest()
        d.add_array("0/0", np.array(items, dtype=object))
        return d.hexdigest()

    assert digest([b"ab", b"c"]) == digest([b"ab", b"c"])
    assert digest([b"ab", b"c"]) != digest([b"a", b"bc"])  # lengths are part of it


class _OverrunRing:
    """What the ring gives when the pipeline overwrote fingerprints no trace point read."""

    def __init__(self) -> None:
        self.calls = 0

    def take(self) -> tuple[list[str], int]:
        self.calls += 1
        return (["aa", "bb"], 3) if self.calls == 1 else (["cc", "dd"], 0)


def test_fingerprints_lost_to_an_overrun_count_as_their_steps_and_leave_the_epoch_out() -> None:
    data = ConsumedData()
    data.ring = _OverrunRing()  # type: ignore[assignment]
    fingerprint, warning = data.end_epoch(1, 5)  # 3 lost + 2 read: five steps
    assert fingerprint is None
    assert warning is not None and "more than" in warning and "epoch 1" in warning
    fingerprint, warning = data.end_epoch(2, 7)  # the next epoch is whole again
    assert fingerprint is not None and warning is None
