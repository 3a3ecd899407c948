"""The house: otel_guard's import graph has no circle and no upward arrow, and no source file is long.

Read from the source (every ``import`` and ``from ... import``, at module level or inside a function):
data flows one way, from the runtime adapters through the guard to the chain.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "otel_guard"
MAX_LINES = 800


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def _ours(name: str) -> bool:
    return name == "otel_guard" or name.startswith("otel_guard.")


def _owner(name: str) -> str:
    """The module of ours that ``name`` (a module or a name in one) lives in."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {_owner(a.name) for a in node.names if _ours(a.name)}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if _ours(base):
                found |= {
                    f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _owner(base) for a in node.names
                }
    return found - {module}


GRAPH = {module: imports_of(module) for module in MODULES}


def test_the_import_graph_has_no_circle() -> None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for imported in sorted(GRAPH[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, [])


def test_no_arrow_points_up() -> None:
    """The chain knows tokens only (its JWS basics, its claims' reader and its keys, below it, know
    nothing else of ours); the decision knows the chain and the settings; nothing below the runtime
    adapters imports them, nothing imports the package's own face, and only the CLI the demo."""
    assert GRAPH["otel_guard._jws"] == set()
    assert GRAPH["otel_guard._jwk"] == {"otel_guard._jws"}
    assert GRAPH["otel_guard.keys"] == {"otel_guard._jws", "otel_guard._jwk"}
    assert GRAPH["otel_guard._claims_text"] == set()
    assert GRAPH["otel_guard.chain"] == {"otel_guard._jws", "otel_guard._claims_text", "otel_guard.keys"}
    assert GRAPH["otel_guard.policy"] == {"otel_guard.chain", "otel_guard.settings"}
    for module, imported in GRAPH.items():
        if not module.startswith("otel_guard.instrumentation"):
            assert not {m for m in imported if m.startswith("otel_guard.instrumentation")}, module
        if module != "otel_guard" and not module.startswith("otel_guard._demo"):  # the demo is a user
            assert "otel_guard" not in imported, f"{module} imports the package's face"
        if not module.startswith(("otel_guard._demo", "otel_guard.cli")):
            assert not {m for m in imported if m.startswith("otel_guard._demo")}, module


def test_no_source_file_is_longer_than_800_lines() -> None:
    long = {
        m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_chain_knows_nothing_of_opentelemetry() -> None:
    for module in (
        "otel_guard.chain",
        "otel_guard.keys",
        "otel_guard._jwk",
        "otel_guard._jws",
        "otel_guard._claims_text",
    ):
        source = MODULES[module].read_text(encoding="utf-8")
        assert "opentelemetry" not in source, module


def test_every_test_module_has_a_name_of_its_own() -> None:
    """pytest imports test modules by their file's name (its default import mode): two test files of
    one name in different folders stop the whole session at collection."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        if "node_modules" not in path.parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
