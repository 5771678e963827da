"""Fingerprints: what goes into a digest, and what does not."""

from __future__ import annotations

import hashlib

import blake3
import numpy as np
import pytest

from worker.record.fingerprint import (
    StreamDigest,
    combine,
    fingerprint_arrays,
    variable_digest,
)
from worker.record.variable_reads import unique_paths


def test_variable_digest_follows_the_documented_format() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = blake3.blake3(b"a/b\0float32\0[2,3]\0" + array.tobytes()).hexdigest()
    assert variable_digest("a/b", array) == expected
    sha = hashlib.sha256(b"a/b\0float32\0[2,3]\0" + array.tobytes()).hexdigest()
    assert variable_digest("a/b", array, "sha256") == sha


def test_model_fingerprint_is_digest_of_ordered_entries() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array(3, dtype=np.int64)
    fp = fingerprint_arrays([("a/b", a), ("c", b)])
    entries = b"".join(
        path.encode() + b"\0" + bytes.fromhex(variable_digest(path, arr))
        for path, arr in (("a/b", a), ("c", b))
    )
    assert fp.fingerprint == "blake3:" + blake3.blake3(entries).hexdigest()
    assert list(fp.variables) == ["a/b", "c"]
    # Pinned: a change of format would make old fingerprints incomparable with new ones.
    assert fp.fingerprint == (
        "blake3:925939db2fa256d0cbb6c49a25b15518ac7bb49f1e6045c602a3dbd65ba3d2f8"
    )


@pytest.mark.parametrize(
    "other",
    [
        ("w", np.arange(6, dtype=np.float64).reshape(2, 3)),  # dtype
        ("w", np.arange(6, dtype=np.float32).reshape(3, 2)),  # shape, same bytes
        ("v", np.arange(6, dtype=np.float32).reshape(2, 3)),  # path
        ("w", np.nextafter(np.arange(6, dtype=np.float32), 10).reshape(2, 3)),  # one ULP
    ],
)
def test_every_part_of_a_variable_changes_its_digest(other: tuple[str, np.ndarray]) -> None:
    base = variable_digest("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert variable_digest(*other) != base


def test_byte_order_of_the_array_does_not_matter() -> None:
    little = np.linspace(-1, 1, 17, dtype="<f4")
    big = little.astype(">f4")
    assert variable_digest("x", big) == variable_digest("x", little)


def test_non_contiguous_views_hash_like_their_values() -> None:
    full = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = full[:, ::2]
    assert variable_digest("x", view) == variable_digest("x", view.copy())


def test_combined_fingerprint_depends_on_order() -> None:
    d = variable_digest("x", np.zeros(3))
    e = variable_digest("y", np.ones(3))
    assert combine([("x", d), ("y", e)]) != combine([("y", e), ("x", d)])


def test_duplicate_paths_are_refused_and_made_unique() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        fingerprint_arrays([("a", np.zeros(1)), ("a", np.zeros(1))])
    assert unique_paths(["a", "b", "a", "a"]) == ["a", "b", "a#1", "a#2"]


def test_unknown_algorithm_lists_the_known() -> None:
    with pytest.raises(ValueError, match="blake3, sha256"):
        variable_digest("x", np.zeros(1), "md5")


def test_large_arrays_hash_the_same_threaded_or_not() -> None:
    big = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
    header = b"x\0float32\0[2000000]\0"
    assert variable_digest("x", big) == blake3.blake3(header + big.tobytes()).hexdigest()


def test_stream_digest_sees_names_and_values() -> None:
    def digest(*arrays: tuple[str, np.ndarray]) -> str:
        s = StreamDigest()
        for name, arr in arrays:
            s.add_array(name, arr)
        return s.hexdigest()

    one = digest(("0/0", np.ones(3)), ("0/1", np.zeros(2)))
    assert one == digest(("0/0", np.ones(3)), ("0/1", np.zeros(2)))
    assert one != digest(("0/0", np.ones(3)), ("0/1", np.zeros(3)))
    assert one != digest(("0/1", np.zeros(2)), ("0/0", np.ones(3)))
    assert one.startswith("blake3:")
