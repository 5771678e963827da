"""Where Python's and NumPy's global generators stood when `reprotrain` began and finished
importing, so `reprotrain.init()` can tell the script's own draws before it (a shuffle, a
split) from the ones the client's dependencies make while they import."""

from __future__ import annotations

import random
import sys


def positions() -> tuple[int, int | None]:
    """(Python's Mersenne Twister index, NumPy's global one if NumPy is loaded)."""
    numpy = sys.modules.get("numpy")
    at_numpy = int(numpy.random.get_state()[2]) if numpy is not None else None
    return int(random.getstate()[1][-1]), at_numpy


BEFORE = positions()
AFTER: tuple[int, int | None] | None = None


def imported() -> None:
    """Called once the client has imported all it imports."""
    global AFTER
    AFTER = positions()
