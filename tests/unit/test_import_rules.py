"""What may import what (the README's "Development" section).

- `worker` never imports `service`.
- The API process (every `service` module but the CLI's) never imports TensorFlow, Keras
  or the node side (`worker.node`), and may import only worker modules that are
  TensorFlow-free.
- `worker.compare`, `worker.spec` and `worker.node` never import TensorFlow or Keras.

Checked twice: statically, over every import statement, including those inside functions
(they run when the function is first called), and by importing the modules in a fresh
interpreter and looking at `sys.modules`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("tensorflow", "keras")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    lazy: bool  # inside a function: runs on first call, not on import
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for top in ("worker", "service"):
        for path in sorted((ROOT / top).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path) -> Iterator[Edge]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, lazy: bool) -> Iterator[Edge]:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Edge(name, alias.name, inner, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                yield Edge(name, base, inner, child.lineno)
                for alias in child.names:
                    if f"{base}.{alias.name}" in _modules():
                        yield Edge(name, f"{base}.{alias.name}", inner, child.lineno)
            elif (
                isinstance(child, ast.If)
                and isinstance(child.test, ast.Name)
                and child.test.id == "TYPE_CHECKING"
            ):
                continue  # never runs
            else:
                yield from visit(child, inner)

    yield from visit(ast.parse(path.read_text()), False)


def scan() -> list[list[object]]:
    """Every import statement of worker/ and service/, as [source, target, lazy, line]."""
    return [
        [e.source, e.target, e.lazy, e.line]
        for name, path in _modules().items()
        for e in _imports(name, path)
    ]


@cache
def _edges() -> tuple[Edge, ...]:
    # Parsed in a fresh interpreter: CPython 3.11's AST conversion keeps its recursion count
    # in state shared by the whole interpreter (python/cpython#106905), so in a test process
    # with other threads running ast.parse can fail with "recursion depth mismatch".
    code = "import json; from tests.unit.test_import_rules import scan; print(json.dumps(scan()))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return tuple(Edge(*row) for row in json.loads(done.stdout))


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@cache
def _imports_heavy_on_import(module: str) -> bool:
    """Whether importing `module` imports TensorFlow or Keras (module-level imports only)."""
    seen: set[str] = set()
    stack = [module]
    while stack:
        current = stack.pop()
        for edge in _edges():
            if edge.source != current or edge.lazy or edge.target in seen:
                continue
            if _under(edge.target, *HEAVY):
                return True
            seen.add(edge.target)
            if edge.target in _modules():
                stack.append(edge.target)
    return False


def _api_module(module: str) -> bool:
    return _under(module, "service") and not _under(module, "service.cli")


def _tensorflow_free(module: str) -> bool:
    return _under(module, "worker.compare", "worker.spec", "worker.node")


def _violations(edges: Iterable[Edge]) -> list[str]:
    found = []
    for e in edges:
        where = f"{e.source} (line {e.line}) imports {e.target}"
        if _under(e.source, "worker") and _under(e.target, "service"):
            found.append(f"{where}: worker never imports service")
        if _api_module(e.source):
            if _under(e.target, *HEAVY) or _under(e.target, "worker.node"):
                found.append(f"{where}: the API process never imports it")
            elif e.target in _modules() and _imports_heavy_on_import(e.target):
                found.append(f"{where}, which imports TensorFlow: the API process must not")
        if _tensorflow_free(e.source):
            if _under(e.target, *HEAVY):
                found.append(f"{where}: {e.source} stays TensorFlow-free")
            elif e.target in _modules() and _imports_heavy_on_import(e.target):
                found.append(f"{where}, which imports TensorFlow: {e.source} stays free of it")
    return found


def test_no_import_breaks_the_rules() -> None:
    assert _violations(_edges()) == []


@pytest.mark.parametrize(
    ("source", "target", "lazy", "rule"),
    [
        ("worker.compare.verdict", "tensorflow", True, "stays TensorFlow-free"),
        ("worker.node.agent", "keras", False, "stays TensorFlow-free"),
        ("worker.spec", "worker.training.loop", True, "which imports TensorFlow"),
        ("service.runs.queue", "worker.node.client", True, "the API process never imports"),
        ("service.api.main", "worker.data.generators", False, "which imports TensorFlow"),
        ("worker.record.trace", "service.persistence.models", True, "worker never imports"),
    ],
)
def test_the_rules_catch_a_forbidden_import(
    source: str, target: str, lazy: bool, rule: str
) -> None:
    found = _violations([Edge(source, target, lazy, 1)])
    assert len(found) == 1 and rule in found[0], found


def test_the_rules_allow_what_the_design_allows() -> None:
    allowed = [
        Edge("service.runs.experiments", "worker.spec", False, 1),
        Edge("service.verification.comparisons", "worker.compare.verdict", False, 1),
        Edge("service.cli.server", "worker.node.agent", True, 1),
        Edge("worker.training.loop", "tensorflow", False, 1),
    ]
    assert _violations(allowed) == []


def _loaded_after_importing(modules: Iterable[str], prefixes: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {sorted(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_the_api_process_imports_neither_tensorflow_nor_the_node_side() -> None:
    api = [m for m in _modules() if _api_module(m)]
    assert _loaded_after_importing(api, ("tensorflow", "keras", "worker.node")) == []


def test_tensorflow_free_packages_import_no_tensorflow() -> None:
    free = [m for m in _modules() if _tensorflow_free(m)]
    assert _loaded_after_importing(free, HEAVY) == []


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


# The Python client (`reprotrain`, code in service/client) installs and imports on its own.
CLIENT = "service.client"
CLIENT_DEPENDS_ON = ("httpx", "pydantic", "yaml")
# `reprotrain.init`, the in-script runtime: loaded by the package on first use only.
CLIENT_LAZY_EXCEPTION = ("service.client", "worker.script")


def _client_violations(edges: Iterable[Edge]) -> list[str]:
    found = []
    for e in edges:
        where = f"{e.source} (line {e.line}) imports {e.target}"
        inside = _under(e.source, CLIENT)
        if not inside and _under(e.target, CLIENT):
            found.append(f"{where}: import it as `reprotrain`")
        top = e.target.split(".")[0]
        if e.lazy and (e.source, e.target) == CLIENT_LAZY_EXCEPTION:
            continue
        if inside and not (
            _under(e.target, CLIENT) or top in sys.stdlib_module_names or top in CLIENT_DEPENDS_ON
        ):
            found.append(f"{where}: the client needs only {', '.join(CLIENT_DEPENDS_ON)}")
    return found


def test_the_client_imports_only_itself_and_its_dependencies_and_is_imported_by_name() -> None:
    assert any(_under(e.source, CLIENT) for e in _edges())
    assert _client_violations(_edges()) == []


@pytest.mark.parametrize(
    ("source", "target", "rule"),
    [
        ("service.cli.remote", "service.client.client", "as `reprotrain`"),
        ("service.client.client", "worker.spec", "needs only"),
        ("service.client.models", "service.schemas", "needs only"),
    ],
)
def test_the_client_rules_catch_a_forbidden_import(source: str, target: str, rule: str) -> None:
    found = _client_violations([Edge(source, target, True, 1)])
    assert len(found) == 1 and rule in found[0], found


def test_the_in_script_runtime_may_reach_the_client_only_lazily() -> None:
    lazily, at_import = (Edge(*CLIENT_LAZY_EXCEPTION, lazy, 1) for lazy in (True, False))
    assert _client_violations([lazily]) == []
    assert len(_client_violations([at_import])) == 1
