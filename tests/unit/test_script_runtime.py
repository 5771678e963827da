"""The in-script runtime's pieces that need no TensorFlow: `reprotrain` stays light until
`init` is asked for, and a function runs the moment a module's import finishes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from worker.script.on_import import after_import


def test_the_client_and_init_load_no_tensorflow() -> None:
    code = textwrap.dedent(
        """
        import sys
        import reprotrain
        assert callable(reprotrain.init) and reprotrain.ScriptRun is not None
        print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_hook_runs_once_right_after_the_import_and_at_once_when_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "late_module.py").write_text("VALUE = 41\nVALUE += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def note(module: ModuleType) -> None:
        seen.append(module.VALUE)  # the module's own code has run to its end

    after_import("late_module", note)
    assert seen == []
    import late_module

    assert seen == [42]
    del sys.modules["late_module"]
    import late_module  # noqa: F401, F811  (imported again: the hook is spent)

    assert seen == [42]
    after_import("late_module", note)  # already imported: at once
    assert seen == [42, 42]
    del sys.modules["late_module"]


def test_a_cancelled_hook_never_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "never_hooked.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    cancel = after_import("never_hooked", lambda m: seen.append(m.__name__))
    cancel()
    import never_hooked  # noqa: F401

    assert seen == []
    del sys.modules["never_hooked"]
