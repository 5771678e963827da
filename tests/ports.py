"""Listening ports for servers the tests start, without two test processes ever sharing one.

A port taken with bind(("127.0.0.1", 0)) and released comes from the kernel's ephemeral range,
so a parallel test process can be handed the same one before either server binds it; the test
whose server lost then talks to the other's. Instead each test process (each pytest-xdist
worker) hands out ports from its own block below the ephemeral range (32768 and up on Linux),
skipping any that something else already holds.
"""

from __future__ import annotations

import itertools
import os
import re
import socket

HOST = "127.0.0.1"
FIRST_PORT = 20000
BLOCK = 1500
BLOCKS = 8  # 20000-31999, under the ephemeral range


def _block_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    found = re.fullmatch(r"gw(\d+)", worker)
    index = int(found.group(1)) + 1 if found else 0  # the controller or -n 0 takes block 0
    return FIRST_PORT + (index % BLOCKS) * BLOCK


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


_next = itertools.count(os.getpid() % BLOCK)


def free_port() -> int:
    """A port no other test process will be given, and free right now."""
    start = _block_start()
    for _ in range(BLOCK):
        port = start + next(_next) % BLOCK
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {start}-{start + BLOCK - 1}")
