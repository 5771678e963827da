"""The API process, the CLI and the worker agent start without importing TensorFlow."""

from __future__ import annotations

import subprocess
import sys


def test_service_modules_do_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "import service.app, service.cli.app, service.persistence.migrate\n"
        "import worker.node.agent, worker.node.executors.process\n"
        "from service.app import create_app\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_api_process_does_not_import_the_node_side() -> None:
    code = (
        "import sys\n"
        "import service.app, service.persistence.migrate\n"
        "print(sorted(m for m in sys.modules if m.startswith('worker.node')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
