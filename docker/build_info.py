"""Write an image's build-info document (JSON on stdout) from its hashed lock.

Runs once while the image is built, with the image's own Python; the result lands in
/etc/reprotrain/build-info.json, so anyone can read what an image pins without running
TensorFlow: the lock's digest, the TensorFlow, CUDA, cuDNN and NCCL wheel versions, the
Python version, the base image, and the commit the source was built from (which jobs in the
image record as their package.git_commit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import sys
from pathlib import Path

# PyPI distribution names whose pinned versions are the image's CUDA stack.
_PINS = {
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "cuda": ("nvidia-cuda-runtime-cu12",),
    "cudnn": ("nvidia-cudnn-cu12",),
    "cublas": ("nvidia-cublas-cu12",),
    "nccl": ("nvidia-nccl-cu12",),
}


def lock_pins(text: str) -> dict[str, str]:
    """Every `name==version` a requirements lock pins, by normalized name."""
    pins: dict[str, str] = {}
    pattern = r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)"
    for match in re.finditer(pattern, text, re.M):
        pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--base-digest", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--revision-dirty", choices=("true", "false", "unknown"), default="unknown")
    parser.add_argument("--version", required=True)
    args = parser.parse_args(argv)
    data = args.lock.read_bytes()
    pins = lock_pins(data.decode())
    doc: dict[str, object] = {
        "lock": args.lock.name,
        "lock_digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "python": platform.python_version(),
        "base_image": args.base,
        "base_digest": args.base_digest,
        "revision": args.revision,
        # Whether the tree had uncommitted changes: the commit alone would not say what ran.
        "revision_dirty": {"true": True, "false": False}.get(args.revision_dirty),
        "reprotrain": args.version,
    }
    for key, names in _PINS.items():
        doc[key] = next((pins[n] for n in names if n in pins), None)
    flavors = [name for name in _PINS["tensorflow"] if name in pins]
    doc["tensorflow_package"] = flavors[0] if flavors else None
    json.dump(doc, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
