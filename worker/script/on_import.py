"""Run a function the moment a module has finished importing, without importing it first.

`reprotrain.init()` sits at the top of a script, usually before `import tensorflow`; it
must not import TensorFlow itself (a script may never use it), yet TensorFlow has to be
seeded and made deterministic before the script builds a model. A finder at the front of
`sys.meta_path` finds the module's spec with the finders after it and wraps that spec's
loader, so each function waiting for the module runs right after the module's own code,
once, in the order they were asked for.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str) -> None:
        self.name = name
        self.waiting: list[Callable[[ModuleType], None]] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = None
        for finder in sys.meta_path:
            if isinstance(finder, _AfterImport) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        self.remove()
        loader: Any = spec.loader
        load = loader.exec_module
        waiting = self.waiting

        def exec_module(module: ModuleType) -> None:
            load(module)
            for then in list(waiting):
                then(module)

        loader.exec_module = exec_module  # this spec's loader only: one module's
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def after_import(name: str, then: Callable[[ModuleType], None]) -> Callable[[], None]:
    """Call `then(module)` once `name` is imported: now if it already is, else right after
    its import finishes. Returns a function that cancels a call still waiting."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return lambda: None
    finder = next(
        (f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name), None
    )
    if finder is None:
        finder = _AfterImport(name)
        sys.meta_path.insert(0, finder)
    finder.waiting.append(then)
    waiting = finder.waiting

    def cancel() -> None:
        if then in waiting:
            waiting.remove(then)
        if not waiting and finder is not None:
            finder.remove()

    return cancel
