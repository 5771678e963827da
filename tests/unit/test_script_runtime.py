"""The in-script runtime's pieces that need no TensorFlow: `reprotrain` stays light until
`init` is asked for, and a function runs the moment a module's import finishes."""

from __future__ import annotations

import os
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


def test_two_hooks_on_one_module_both_run_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "twice_hooked.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    after_import("twice_hooked", lambda m: seen.append("first"))
    cancel = after_import("twice_hooked", lambda m: seen.append("cancelled"))
    after_import("twice_hooked", lambda m: seen.append("second"))
    cancel()
    import twice_hooked  # noqa: F401

    assert seen == ["first", "second"]
    del sys.modules["twice_hooked"]


def test_init_outside_a_scripts_top_level_warns_and_records_instead_of_restarting(
    tmp_path: Path,
) -> None:
    code = textwrap.dedent(
        f"""
        import json, sys, warnings
        import reprotrain
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = reprotrain.init(project="p", seed=5, runs_dir={str(tmp_path)!r})
        print(json.dumps([str(w.message) for w in caught]))
        print(json.dumps(run.record["warnings"]), run.seed, "tensorflow" in sys.modules)
        run.finish()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    warned, recorded = out.stdout.strip().splitlines()
    assert "PYTHONHASHSEED" in warned and "command line" in warned
    assert "PYTHONHASHSEED" in recorded and recorded.endswith("(5, 0) False")
    (record,) = tmp_path.glob("*/run.json")
    assert '"status": "succeeded"' in record.read_text()
