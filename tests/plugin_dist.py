"""Installs the test plugins as a real distribution (a dist-info folder on a path entry)."""

from __future__ import annotations

from pathlib import Path

PLUGIN_DIR = Path(__file__).parent / "plugins"

ENTRY_POINTS = """\
[reprotrain.generators]
stateful_noise = repro_test_plugins:stateful_noise
entropy_noise = repro_test_plugins:entropy_noise
scalar_output = repro_test_plugins:scalar_output
gaussian_blobs = repro_test_plugins:stateful_noise

[reprotrain.architectures]
wide_mlp = repro_test_plugins:wide_mlp
perturbed_mlp = repro_test_plugins:perturbed_mlp
twin_mlp = repro_test_plugins:twin_mlp
paced_mlp = repro_test_plugins:paced_mlp
noisy_mlp = repro_test_plugins:noisy_mlp
"""


def make_plugin_site(root: Path) -> Path:
    """A directory that, on sys.path or PYTHONPATH, makes the plugins discoverable."""
    info = root / "reprotrain_test_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: reprotrain-test-plugins\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return root
