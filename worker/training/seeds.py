"""Seed resolution and derivation, free of TensorFlow so the API can resolve seeds too."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

SEED_MAX = 2**63 - 1  # seeds travel as int64 into TensorFlow's stateless ops

SeedTuple = tuple[int, int]


def check_seed_part(value: int) -> int:
    """Return `value` if it is a usable seed component, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"seed components must be integers, got {value!r}")
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"seed components must be in [0, 2**63-1], got {value}")
    return value


def seed_tuple(seed: int | Sequence[int]) -> SeedTuple:
    """Normalise an int or a pair of ints to the (int, int) pair the stateless ops take.

    An int `s` becomes `(s, 0)`, so `seed: 7` and `seed: [7, 0]` are the same experiment.
    """
    if isinstance(seed, int) and not isinstance(seed, bool):
        return (check_seed_part(seed), 0)
    if isinstance(seed, bool):
        raise ValueError("a seed is an integer or a pair of integers, not a boolean")
    parts = list(seed)
    if len(parts) != 2:
        raise ValueError(f"a seed pair has exactly two integers, got {len(parts)}")
    return (check_seed_part(parts[0]), check_seed_part(parts[1]))


def random_seed() -> SeedTuple:
    """A cryptographically random seed pair (for specs that leave the seed null)."""
    return (secrets.randbelow(SEED_MAX + 1), secrets.randbelow(SEED_MAX + 1))


def resolve_seed(seed: int | Sequence[int] | None) -> SeedTuple:
    """The seed pair to run with: the given one normalised, or a fresh random one."""
    return random_seed() if seed is None else seed_tuple(seed)


def derive_int_seed(seed: SeedTuple, *keys: int | str, bits: int = 32) -> int:
    """A `bits`-bit integer derived from the seed and keys, for APIs that take one int.

    Python's `random`, NumPy and Keras take a single integer; deriving it by hashing keeps
    (seed, task, epoch) streams independent without relying on any library's RNG.
    """
    material = ":".join(str(part) for part in (*seed, *keys)).encode()
    digest = hashlib.sha256(b"reprotrain-seed:" + material).digest()
    return int.from_bytes(digest[:8], "little") % (1 << bits)
