"""Versions of the CUDA libraries as their sources spell them (TensorFlow's build, the
image's lock, the runtime's integers) read into numbers and compared to the depth both give;
and the flags of XLA_FLAGS / TF_XLA_FLAGS. Pure functions of the strings real systems print."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from worker.record import gpu_info

# A bare number this large is a library's version integer (12050, 90100, 8906), not a major.
_VERSION_INTEGER = 1000
_VERSION_TEXT = re.compile(r"\s*v?(\d+(?:\.\d+)*)(?![\d_])", re.IGNORECASE)
_XLA_TOKEN = re.compile(r"""(?:[^\s"']|"[^"]*"|'[^']*')+""")


def _version(value: object, decode: Callable[[int], str]) -> tuple[int, ...] | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        number = int(value)
        if number >= _VERSION_INTEGER:
            return tuple(int(part) for part in decode(number).split("."))
        return (number,) if number >= 0 else None
    match = _VERSION_TEXT.match(str(value))
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def parse_cuda_version(value: object) -> tuple[int, ...] | None:
    """A CUDA version as numbers, from TensorFlow's build ("12.5.1"), a lock ("12.5.82") or the
    driver's or runtime's integer (12050 is major*1000 + minor*10: no patch); None if unreadable."""
    return _version(value, gpu_info.format_driver_version)


def parse_cudnn_version(value: object) -> tuple[int, ...] | None:
    """A cuDNN version as numbers, from TensorFlow's build ("9"), a lock ("9.3.0.75") or
    cudnnGetVersion() (90100 in cuDNN 9: major*10000 + minor*100 + patch; 8906 before it:
    major*1000 + minor*100 + patch); None if unreadable."""
    return _version(value, gpu_info.format_cudnn_version)


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


# Per library: name, parser, key in the build and the lock, key in `loaded`, and how many
# numbers are compared. CUDA stops at major.minor: the runtime's integer carries no patch, and a
# lock's third number is its wheel's (nvidia-cuda-runtime-cu12 12.5.82 is CUDA 12.5.1's
# runtime). cuDNN's wheel and cudnnGetVersion() agree to the patch (9.3.0.75 loads as 9.3.0).
LIBRARIES = (
    ("CUDA", parse_cuda_version, "cuda", "runtime_version", 2),
    ("cuDNN", parse_cudnn_version, "cudnn", "cudnn_version", 3),
)
_LOADED_PARSERS = {
    "driver_version": parse_cuda_version,
    "runtime_version": parse_cuda_version,
    "cudnn_version": parse_cudnn_version,
}


def agree(a: tuple[int, ...], b: tuple[int, ...], depth: int) -> bool:
    """Whether two versions agree in their first `depth` numbers, or in as many as both give."""
    shared = min(len(a), len(b), depth)
    return a[:shared] == b[:shared]


def loaded_versions(loaded: Mapping[str, Any]) -> dict[str, Any]:
    """Loaded library versions with the libraries' integers written as dotted versions."""
    shown = dict(loaded)
    for key, value in loaded.items():
        parsed = _LOADED_PARSERS[key](value) if key in _LOADED_PARSERS else None
        if parsed is not None and not isinstance(value, str):
            shown[key] = dotted(parsed)
    return shown


def parse_xla_flags(text: str | None) -> dict[str, str] | None:
    """The flags of an XLA_FLAGS or TF_XLA_FLAGS value by name ("true" for a bare `--name`, the
    last of a repeated one winning, as in XLA's parser); None when the variable is unset."""
    if text is None:
        return None
    found: dict[str, str] = {}
    for token in _XLA_TOKEN.findall(text):
        name, sep, value = token.lstrip("-").partition("=")
        if token.startswith("-") and name:
            found[name] = value.strip("\"'") if sep else "true"
    return found
