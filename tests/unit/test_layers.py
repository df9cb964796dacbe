"""The package's shape: no import cycles, and the contract stays light.

The layers themselves are import-linter's contract in pyproject.toml (`make lint`).
"""

from __future__ import annotations

import subprocess
import sys

import grimp
import pytest


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("toolq", cache_dir=None)


def test_no_module_imports_itself_through_others(graph: grimp.ImportGraph) -> None:
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_no_package_imports_itself_through_others(graph: grimp.ImportGraph) -> None:
    # Each module counts as its top package below toolq (toolq.services.tasks.run ->
    # toolq.services.tasks).
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            a, b = package(m), package(imported)
            if a != b:
                edges.setdefault(a, set()).add(b)
    assert _cycles(edges) == []


@pytest.mark.parametrize(
    "module",
    [
        "toolq.core.envelope",
        "toolq.core.errors",
        "toolq.core.render",
        "toolq",
        "toolq.decisions.recovery.policy",
    ],
)
def test_importing_the_contract_loads_no_celery_or_redis(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'celery', 'kombu', 'redis'}); "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_package_still_exports_its_public_names() -> None:
    import toolq

    for name in toolq.__all__:
        assert getattr(toolq, name) is not None
    with pytest.raises(AttributeError):
        _ = toolq.NoSuchName  # type: ignore[attr-defined]
