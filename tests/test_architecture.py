"""The shape of the code, checked: no import cycles, the layers import downwards only, tests never import
benchmark code, and no module grows past what a newcomer can read in one sitting.

Imports are read with ``ast`` from every module, including imports inside functions and under
``if TYPE_CHECKING:`` (a cycle hidden behind TYPE_CHECKING is still a cycle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("voice", "llm", "audio")
MAX_LINES = 420  # "about 400": a module past this gets split


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """First-party modules ``path`` imports (``from voice.x import y`` counts as voice.x, or voice.x.y when
    that is a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in known:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, known) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            # a package's __init__ is not an edge to everything below it
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_audio_and_llm_never_import_voice():
    offenders = {
        m: sorted(i for i in deps if i.startswith("voice"))
        for m, deps in _graph().items()
        if m.startswith(("audio", "llm"))
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_library_never_imports_the_app_or_the_benchmarks():
    """voice/app (the CLI) and the benchmarks sit on top; nothing in the library reaches up into them."""
    top = ("voice.app", "voice.bench", "llm.bench")
    offenders = {
        m: sorted(d for d in deps if d.startswith(top)) for m, deps in _graph().items() if not m.startswith(top)
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_tests_never_import_benchmark_code():
    known = set(_modules())
    offenders = {
        p.name: sorted(i for i in _imports(p, known) if i.startswith(("voice.bench", "llm.bench")))
        for p in (ROOT / "tests").rglob("*.py")
    }
    assert {name: deps for name, deps in offenders.items() if deps} == {}


def test_no_module_is_too_long_to_read_in_one_sitting():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
