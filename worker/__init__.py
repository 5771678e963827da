"""Reprotrain training runtime: stateless data, determinism, fingerprints, provenance.

Importing this package never imports TensorFlow; the modules that need it import it
themselves, so the API process can use the spec, registry and trace comparison cheaply.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("reprotrain")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
