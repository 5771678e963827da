"""The API process, the CLI and the worker agent start without importing TensorFlow."""

from __future__ import annotations

import subprocess
import sys


def test_service_modules_do_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "import service.app, service.cli.app, service.agent, service.migrate\n"
        "from service.app import create_app\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
