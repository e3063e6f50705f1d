"""DESIGN.md layers: imports only point down. Checks every import, including
ones inside functions, which a module-level lint would miss."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "gpudash"
RULES = {
    "server": {"torch", "pynvml"},
    # analysis derives facts; rendering them (HTML, Markdown, templates) is the report's and the server's
    "analysis": {"torch", "pynvml", "dash", "plotly", "jinja2", "markupsafe", "html"},
    # the report renders analysis (Jinja2 templates, inline SVG): no torch, no dashboard libraries
    "report": {"torch", "pynvml", "dash", "plotly", "flask"},
    "store": {"torch", "pynvml", "dash", "plotly"},
    "collectors": {"dash", "plotly"},
    "trainer": {"dash", "plotly"},
    "integrations": {"dash", "plotly"},
    "zerocode": {"dash", "plotly"},
    "monitor": {"dash", "plotly"},
    "options.py": {"torch", "pynvml", "dash", "plotly"},
    "errors.py": {"torch", "pynvml", "dash", "plotly"},
    "units.py": {"torch", "pynvml", "dash", "plotly"},
    "testing.py": {"dash", "plotly"},
    # alerts: the Monitor (a training process) and `gpudash serve` both run them
    "alerts": {"torch", "pynvml", "dash", "plotly"},
    # the memory model is arithmetic: the dashboard's advice and `gpudash estimate` run it without torch
    "memmodel": {"torch", "pynvml", "dash", "plotly", "flask", "pandas"},
}


def _imports(path: Path) -> set[str]:
    """Top-level names of the packages ``path`` imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_layers_are_honest() -> None:
    bad = []
    for part, banned in RULES.items():
        target = PKG / part
        files = [target] if target.is_file() else sorted(target.rglob("*.py"))
        for f in files:
            hit = _imports(f) & banned
            if hit:
                bad.append(f"{f.relative_to(PKG.parent)} imports {sorted(hit)}")
    assert not bad, "\n".join(bad)


# ---- the import graph among gpudash modules ------------------------------------------------
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(f): f for f in PKG.rglob("*.py")}


def _gpudash_imports(name: str, path: Path) -> set[str]:
    """gpudash modules ``name`` imports anywhere in its source: at the top, inside
    functions and under ``if TYPE_CHECKING:`` (a type-only import is still a dependency).
    ``from gpudash.a import b`` counts as ``gpudash.a.b`` when that is a module."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in MODULES else mod)
    return {m for m in out if m in MODULES and m != name}


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
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_sees_type_checking_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "gpudash"
    (pkg / "collectors").mkdir(parents=True)
    (pkg / "collectors" / "__init__.py").write_text("")
    (pkg / "collectors" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpudash.monitor import Monitor\n")
    (pkg / "monitor.py").write_text("def f():\n    from .collectors import base\n")
    mods = {"gpudash.collectors": pkg / "collectors" / "__init__.py",
            "gpudash.collectors.base": pkg / "collectors" / "base.py", "gpudash.monitor": pkg / "monitor.py"}
    saved = dict(MODULES)
    MODULES.clear()
    MODULES.update(mods)
    try:
        graph = {n: _gpudash_imports(n, p) for n, p in mods.items()}
    finally:
        MODULES.clear()
        MODULES.update(saved)
    assert graph["gpudash.collectors.base"] == {"gpudash.monitor"}
    assert graph["gpudash.monitor"] == {"gpudash.collectors.base"}
    assert _cycles(graph) == [["gpudash.collectors.base", "gpudash.monitor"]]


def test_no_import_cycles_among_gpudash_modules() -> None:
    graph = {name: _gpudash_imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_collectors_record_through_the_interface_not_the_monitor() -> None:
    bad = [name for name, path in MODULES.items() if name.startswith("gpudash.collectors")
           and any(_under(m, ("gpudash.monitor",)) for m in _gpudash_imports(name, path))]  # the package, any part
    assert not bad, f"{bad} import gpudash.monitor; use gpudash.collectors.api.Recording"


def test_the_steps_table_has_one_writer() -> None:
    """Only the Monitor puts rows into ``steps``: its ``_put_step`` (``recorder.steps.put``, the step log, bound
    once) is called by ``Monitor.put_step`` and the step timer; the CUDA timer hands its rows to ``put_step``
    (its step-end hook holds a row until its GPU times are known). Nothing calls ``put("steps", ...)``."""
    bound, calls, by_name = [], [], []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.Attribute) and node.attr == "put" and isinstance(node.value, ast.Attribute)
                        and node.value.attr == "steps"):
                    bound.append(f"{name}.{fn.name}")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr == "_put_step":
                        calls.append(f"{name}.{fn.name}")
                    if (node.func.attr == "put" and node.args and isinstance(node.args[0], ast.Constant)
                            and node.args[0].value == "steps"):
                        by_name.append(f"{name}.{fn.name}")
    # (Recorder.put routes a "steps" record to the log too: the store's own entry, which nothing here calls)
    assert sorted(bound) == ["gpudash.monitor.core.__init__", "gpudash.store.writer.put"] and by_name == []
    assert sorted(calls) == ["gpudash.monitor.core.put_step", "gpudash.monitor.timing.__exit__"]


def test_the_server_opens_runs_in_one_place() -> None:
    """Dashboard pages, the API, /metrics and the notebook read runs through server.runcache only
    (issue 11: a run opened four ways told four stories)."""
    root = PKG / "server"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "runcache.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("RunReader", "load_run", "RankReader"):
                    offenders.append(f"{path.relative_to(PKG)}:{node.lineno} {name}(...)")
    assert offenders == [], "open runs through gpudash.server.runcache.shared_cache(): " + ", ".join(offenders)


# ---- what each side may reach, following imports through every module on the way -------------
#: The training side runs inside the user's training process: it never reaches the server, the
#: commands or the dashboard's libraries, however many modules lie between.
TRAINING_SIDE = ("gpudash.monitor", "gpudash.collectors", "gpudash.trainer", "gpudash.integrations",
                 "gpudash.zerocode", "gpudash.testing", "gpudash.options", "gpudash.errors", "gpudash.units")
#: Read side shared by both: the store, analysis, the report's renderers, alerts and the memory model (below
#: analysis, the trainer builds on it) reach neither side's top.
SHARED = ("gpudash.store", "gpudash.analysis", "gpudash.report", "gpudash.alerts", "gpudash.memmodel")
BANNED_REACH = {
    TRAINING_SIDE: ("gpudash.server", "gpudash.commands", "gpudash.cli", "dash", "plotly", "flask"),
    SHARED: ("gpudash.server", "gpudash.commands", "gpudash.cli", "gpudash.monitor", "gpudash.collectors",
             "gpudash.trainer", "gpudash.integrations", "gpudash.zerocode", "torch", "dash", "plotly", "flask"),
}


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _reach(start: str, graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Every module ``start`` reaches, each with one import chain that gets there (breadth first)."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        here = todo.pop(0)
        for nxt in sorted(graph.get(here, ())):
            if nxt not in chains:
                chains[nxt] = [*chains[here], nxt]
                todo.append(nxt)
    return chains


def _reach_violations(graph: dict[str, set[str]], external: dict[str, set[str]],
                      rules: dict[tuple[str, ...], tuple[str, ...]]) -> list[str]:
    bad = []
    for side, banned in rules.items():
        for start in sorted(m for m in graph if _under(m, side)):
            for mod, chain in _reach(start, graph).items():
                hits = [b for b in banned if _under(mod, (b,)) or b in external.get(mod, set())]
                if hits:
                    bad.append(f"{' -> '.join(chain)} reaches {hits[0]}")
                    break
    return bad


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    return ({n: _gpudash_imports(n, p) for n, p in MODULES.items()},
            {n: _imports(p) for n, p in MODULES.items()})


def test_each_side_reaches_only_what_it_may() -> None:
    graph, external = _graph()
    bad = _reach_violations(graph, external, BANNED_REACH)
    assert not bad, "\n".join(bad)


def test_reach_follows_imports_through_modules_on_the_way() -> None:
    """A training-side module that imports the server through two harmless modules is caught."""
    graph = {"gpudash.monitor": {"gpudash.store.a"}, "gpudash.store.a": {"gpudash.units"},
             "gpudash.units": {"gpudash.server.app"}, "gpudash.server.app": set()}
    external = {"gpudash.server.app": {"dash"}}
    bad = _reach_violations(graph, external, {("gpudash.monitor",): ("gpudash.server", "dash")})
    assert bad == ["gpudash.monitor -> gpudash.store.a -> gpudash.units -> gpudash.server.app reaches gpudash.server"]
    graph["gpudash.units"] = set()
    assert _reach_violations(graph, external, {("gpudash.monitor",): ("gpudash.server", "dash")}) == []


def test_the_server_never_reaches_the_trainer() -> None:
    """The dashboard process runs no trainer code: its advice comes from the memory model below analysis."""
    graph, external = _graph()
    bad = _reach_violations(graph, external, {("gpudash.server",): ("gpudash.trainer", "torch")})
    assert not bad, "\n".join(bad)


def _string_imports(path: Path) -> list[str]:
    """``importlib.import_module(...)`` / ``__import__(...)`` calls whose argument names a gpudash module
    (a literal or an f-string starting with it): imports the layer tests above cannot see."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
        if name not in ("import_module", "__import__") or not node.args:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.JoinedStr):
            arg = arg.values[0] if arg.values else arg
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("gpudash"):
            out.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {name}({arg.value!r}...)")
    return out


def test_no_gpudash_module_is_imported_by_a_string() -> None:
    """Only the CLI loads modules by name (its command table, each command when it runs); elsewhere a string
    import hides a dependency from every test here (issue 35: analysis reached the trainer that way)."""
    bad = [hit for name, path in MODULES.items() if name != "gpudash.cli" for hit in _string_imports(path)]
    assert not bad, "\n".join(bad)


def test_string_import_finder_sees_literals_and_fstrings(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('import importlib\nimportlib.import_module("gpudash.trainer.x")\n'
                 'k = "y"\nimportlib.import_module(f"gpudash.store.{k}")\n__import__("gpudash.a")\n'
                 'importlib.import_module("pandas")\n')
    saved = PKG
    try:
        globals()["PKG"] = tmp_path / "gpudash"
        hits = _string_imports(f)
    finally:
        globals()["PKG"] = saved
    assert len(hits) == 3, hits


def test_only_the_cli_imports_commands() -> None:
    graph, _ = _graph()
    bad = [f"{n} imports {sorted(m for m in deps if _under(m, ('gpudash.commands',)))}" for n, deps in graph.items()
           if not _under(n, ("gpudash.commands", "gpudash.cli")) and any(_under(m, ("gpudash.commands",)) for m in deps)]
    assert not bad, "\n".join(bad)


def test_no_sql_outside_the_store() -> None:
    """The store answers every query: no module elsewhere imports sqlite3 or holds an SQL statement."""
    sql = ("SELECT ", "INSERT ", "CREATE ", "UPDATE ", "DELETE ", "PRAGMA ")
    bad = []
    for name, path in MODULES.items():
        if _under(name, ("gpudash.store",)):
            continue
        tree = ast.parse(path.read_text(), str(path))
        if "sqlite3" in _imports(path):
            bad.append(f"{name} imports sqlite3")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.lstrip().upper().startswith(sql):
                bad.append(f"{name}:{node.lineno} {node.value[:40]!r}")
    assert not bad, "\n".join(bad)
