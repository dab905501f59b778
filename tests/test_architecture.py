"""The shape of the code, checked: no import cycles, the layers import downwards only, tests never import
benchmark code, and no module grows past what a newcomer can read in one sitting.

Imports are read with ``ast`` from every module, including imports inside functions and under
``if TYPE_CHECKING:`` (a cycle hidden behind TYPE_CHECKING is still a cycle in the design).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("voice", "llm", "audio")
MAX_LINES = 500  # "about 400" before ruff format, which spreads calls over more lines; past this, split


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


# voice/'s stages, lowest first: each may import the layers below it and voice/'s shared modules (config, models,
# events, ports, tasks, ...), never a layer above. The stages know nothing of sessions; sessions nothing of wires.
VOICE_LAYERS = (
    ("voice.hearing", "voice.speaking", "voice.remote"),  # ears, mouth, and both on other machines
    ("voice.dialog",),  # sessions, turns, actions, tool calls
    ("voice.transports",),  # websocket (Realtime), Wyoming, MQTT
)


def test_voice_stages_import_downwards_only():
    def layer(module: str) -> int | None:
        return next((i for i, pkgs in enumerate(VOICE_LAYERS) if module.startswith(tuple(p + "." for p in pkgs))), None)

    offenders = {}
    for m, deps in _graph().items():
        here = layer(m)
        if here is None:
            continue
        up = sorted(d for d in deps if (there := layer(d)) is not None and there > here)
        if up:
            offenders[m] = up
    assert offenders == {}
    assert all((ROOT / p.replace(".", "/") / "__init__.py").exists() for pkgs in VOICE_LAYERS for p in pkgs)


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


# ---- ports: the session, its turns and the assistant speak to the models through typed ports -----------------

PORT_USERS = ("voice/dialog/session.py", "voice/dialog/turn.py", "voice/assistant.py")


def _names_any(annotation: ast.expr | None) -> bool:
    """Whether an annotation mentions ``Any`` (also inside a string annotation)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _names_any(ast.parse(annotation.value, mode="eval").body)
    return any(
        (isinstance(node, ast.Name) and node.id == "Any")
        or (isinstance(node, ast.Attribute) and node.attr == "Any")
        or (isinstance(node, ast.Constant) and isinstance(node.value, str) and _names_any(node))
        for node in ast.walk(annotation)
    )


def _annotations_with_any(source: str) -> list[str]:
    """``line: what`` for every parameter, return value and annotated attribute that mentions ``Any``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            params = [
                *a.posonlyargs,
                *a.args,
                *a.kwonlyargs,
                *([a.vararg] if a.vararg else []),
                *([a.kwarg] if a.kwarg else []),
            ]
            found += [f"{node.lineno}: {node.name}({p.arg})" for p in params if _names_any(p.annotation)]
            found += [f"{node.lineno}: {node.name} returns" for _ in [0] if _names_any(node.returns)]
        elif isinstance(node, ast.AnnAssign) and _names_any(node.annotation):
            found.append(f"{node.lineno}: {ast.unparse(node.target)}")
    return found


def test_sessions_turns_and_the_assistant_hold_typed_ports_never_any():
    """What a session, a turn or the assistant holds and passes is a port (voice/ports.py) or a concrete type,
    so mypy checks every implementation against what they use."""
    offenders = {path: found for path in PORT_USERS if (found := _annotations_with_any((ROOT / path).read_text()))}
    assert offenders == {}


def test_the_any_finder_finds_any():
    source = (
        "class A:\n    x: Any\n    y: 'list[Any]'\n    def f(self, a: typing.Any, *b: int) -> dict[str, Any]: ...\n"
    )
    assert _annotations_with_any(source) == ["2: x", "3: y", "4: f(a)", "4: f returns"]


def _probes(source: str) -> list[str]:
    """``line: getattr`` / ``line: hasattr`` for every probe of an object for an ability."""
    return [
        f"{node.lineno}: {node.func.id}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
    ]


def test_the_dialog_never_probes_a_port_for_an_ability():
    """An optional ability is a typed protocol checked once where the chat is built (``voice.ports.LocalChat``,
    ``ChatEngine.concurrent``), so mypy sees every use of it; a ``getattr`` at a call site hides it."""
    paths = sorted((ROOT / "voice" / "dialog").glob("*.py")) + [
        ROOT / "voice" / "assistant.py",
        ROOT / "voice" / "ports.py",
    ]
    offenders = {str(p.relative_to(ROOT)): found for p in paths if (found := _probes(p.read_text()))}
    assert offenders == {}


def test_the_probe_finder_finds_probes():
    source = "def f(chat):\n    if hasattr(chat, 'tools'):\n        return getattr(chat, 'constrain', None)\n"
    assert _probes(source) == ["2: hasattr", "3: getattr"]


_HISTORY_WRITES = ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse")


def _history_writes(source: str) -> list[str]:
    """``line: what`` for every write to a chat's ``messages`` list other than through the chat's own methods."""

    def is_messages(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "messages"

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_messages(node.func.value):
            found += [f"{node.lineno}: messages.{node.func.attr}"] if node.func.attr in _HISTORY_WRITES else []
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else []
        targets += [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        written = [t for t in targets if isinstance(t, ast.Subscript) and is_messages(t.value)]
        found += [f"{node.lineno}: messages[...] written" for _ in written]
    return sorted(found, key=lambda s: int(s.split(":")[0]))


def test_the_history_is_written_only_through_its_own_methods():
    """llm/history.py keeps the commit rules (one reply at a time, written once with what was heard); a caller
    that edits ``messages`` directly can break them. voice/ reads the list and writes through the chat."""
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "voice").rglob("*.py"))
        if (found := _history_writes(path.read_text()))
    }
    assert offenders == {}


def test_the_history_rule_finds_direct_writes():
    source = (
        "def f(chat, m):\n"
        "    chat.messages.extend([m])\n"
        "    chat.conversation.messages.insert(0, m)\n"
        "    chat.messages[:] = [m]\n"
        "    del chat.messages[0]\n"
        "    n = len(chat.messages)\n"
    )
    assert _history_writes(source) == [
        "2: messages.extend",
        "3: messages.insert",
        "4: messages[...] written",
        "5: messages[...] written",
    ]


# ---- tasks: one way to start a task and one way to stop it (voice/tasks.py) ---------------------------------


def _is_timer(receiver: ast.expr) -> bool:
    """A loop timer's handle (``call_later``, ``call_at``) by its name: cancelling one leaves nothing running."""
    name = ast.unparse(receiver).rsplit(".", 1)[-1].casefold()
    return "timer" in name or "tick" in name


def _task_rule_breaks(source: str) -> list[str]:
    """``line: what`` for every task started without voice/tasks.py (``create_task``, ``ensure_future``), every
    hand-written cancel-then-gather (``x.cancel()`` and then ``gather(x, ...)`` in one function) and every task
    cancelled without waiting for its end (a bare ``x.cancel()`` statement; timer handles aside)."""
    tree = ast.parse(source)
    found = [
        f"{node.lineno}: {node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("create_task", "ensure_future")
    ]
    found += [
        f"{node.lineno}: cancel not awaited"
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "cancel"
        and not node.value.args
        and not _is_timer(node.value.func.value)
    ]
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        cancelled = {ast.unparse(c.func.value) for c in calls if c.func.attr == "cancel" and not c.args}
        for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For)):  # for t in (a, *b): t.cancel()
            if ast.unparse(loop.target) in cancelled:
                items = loop.iter.elts if isinstance(loop.iter, ast.Tuple | ast.List) else [loop.iter]
                cancelled |= {ast.unparse(i.value if isinstance(i, ast.Starred) else i) for i in items}
        for call in calls:
            if call.func.attr == "gather":
                gathered = {ast.unparse(a.value if isinstance(a, ast.Starred) else a) for a in call.args}
                found += [f"{call.lineno}: cancel then gather"] if gathered & cancelled else []
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_every_task_starts_and_stops_through_voice_tasks():
    """``tasks.start`` / ``Tasks.spawn`` start every task of voice/, ``cancel_and_wait`` / ``Tasks.stop`` stop
    them: a task that is not kept can vanish mid-flight, and one stopped without waiting still runs. llm/ and
    audio/ start none (a sink's pump is a loop timer; a remote reply reads the server's counters inline)."""
    offenders = {
        str(path.relative_to(ROOT)): found
        for package in ("voice", "llm", "audio")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "voice" / "tasks.py" and (found := _task_rule_breaks(path.read_text()))
    }
    assert offenders == {}


def test_the_task_rule_finds_bare_tasks_and_inline_stops():
    source = (
        "async def f(loop, coro):\n"
        "    t = loop.create_task(coro)\n"
        "    u = asyncio.ensure_future(coro)\n"
        "    t.cancel()\n"
        "    await asyncio.gather(t, return_exceptions=True)\n"
        "    await asyncio.gather(u.wait(), return_exceptions=True)\n"
        "    for task in (t, *others):\n"
        "        task.cancel()\n"
        "    await asyncio.gather(*others)\n"
        "    u.cancel()\n"
        "    self._timer.cancel()\n"
        "    await turn.cancel()\n"
    )
    assert _task_rule_breaks(source) == [
        "2: create_task",
        "3: ensure_future",
        "4: cancel not awaited",
        "5: cancel then gather",
        "8: cancel not awaited",
        "9: cancel then gather",
        "10: cancel not awaited",
    ]


# ---- clocks: a wall clock that jumps moves no deadline ---------------------------------------------------------

WALL_CLOCK_READERS = {
    "voice/transports/mqtt/bridge.py": "the time stamp of an <p>/error message, for whoever reads it",
    "voice/models.py": "when a cache folder was built, in its manifest",
    "llm/engine.py": "a sampling seed when none is set",
}
WALL_CLOCK = re.compile(r"\btime\.time(_ns)?\(\)|\bdatetime\.(now|utcnow|today)\(")


def test_deadlines_and_latencies_run_on_the_monotonic_clock():
    """The wall clock jumps (NTP's first sync after boot, a device without a clock battery, a person setting the
    time): no timeout, deadline, pacing or latency may read it, so it is read only where a stamp is wanted. A
    benchmark's JSON date is such a stamp too."""
    readers = {
        str(path.relative_to(ROOT))
        for package in ("voice", "llm", "audio")
        for path in sorted((ROOT / package).rglob("*.py"))
        if WALL_CLOCK.search(path.read_text()) and "bench" not in path.relative_to(ROOT).parts[1]
    }
    assert readers == set(WALL_CLOCK_READERS)
