"""Write two small datasets the example model definitions train on, from NumPy alone.

images.npz  x uint8 [N, 32, 32, 3], y int64 [N] in 0..9: CIFAR-10-shaped images whose
            class sets the colour and orientation of a striped pattern, with noise, so a
            network has something to learn (nothing is downloaded).
tokens.npz  x int32 [N, 64] token ids in 0..999, y int64 [N] in 0..3: each class draws
            most of its tokens from its own quarter of the vocabulary.

  python examples/models/make_datasets.py [OUT_DIR] [--samples N]
  repro dataset push OUT_DIR/images.npz --name cifar-like
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def cifar_like(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, 32, 32, 3] uint8 and labels [N] in 0..9, fixed by `seed`."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=samples)
    rows, cols = np.mgrid[0:32, 0:32]
    angle = y[:, None, None] * np.pi / 10
    stripes = np.sin((rows * np.cos(angle) + cols * np.sin(angle)) * (1 + y[:, None, None] % 3))
    colour = np.stack([(y % 3) == c for c in range(3)], axis=-1).astype(np.float64) * 0.6 + 0.2
    x = 0.5 + 0.4 * stripes[..., None] * colour[:, None, None, :]
    x += rng.normal(0, 0.1, size=x.shape)
    return (np.clip(x, 0, 1) * 255).astype(np.uint8), y.astype(np.int64)


def tokens(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [N, 64] int32 in 0..999 and labels [N] in 0..3, fixed by `seed`."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=samples)
    own = y[:, None] * 250 + rng.integers(0, 250, size=(samples, 64))
    anywhere = rng.integers(0, 1000, size=(samples, 64))
    x = np.where(rng.random((samples, 64)) < 0.6, own, anywhere)
    return x.astype(np.int32), y.astype(np.int64)


def main() -> None:
    """Write images.npz and tokens.npz into the directory given (default: here)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path(__file__).parent)
    parser.add_argument("--samples", type=int, default=2_048)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (x, y) in (
        ("images", cifar_like(args.samples)),
        ("tokens", tokens(args.samples)),
    ):
        np.savez_compressed(args.out / f"{name}.npz", x=x, y=y)
        print(args.out / f"{name}.npz")


if __name__ == "__main__":
    main()
