"""The shape of the code (issue 24): no import circle, even through imports inside functions; no module
over 600 lines; few `: Any` annotations. Read from the source with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "bootseer_cli"
MAX_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_ANY = 30


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, at the top or inside functions (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            for child in getattr(node, "orelse", []):
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in known:
                out.add(target)
            for a in node.names:  # `from . import capabilities`: a submodule
                if f"{target}.{a.name}" in known:
                    out.add(f"{target}.{a.name}")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_circle() -> None:
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    assert sum(len(v) for v in graph.values()) > 100  # premise: the walk sees the imports
    assert _cycles(graph) == []


def test_the_walk_finds_a_circle_through_a_function(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\ndef f():\n    from .b import x\n"
    )
    assert _imports("pkg.a", tmp_path / "a.py", {"pkg.b", "pkg.c"}) == {"pkg.b"}


def test_no_module_over_600_lines() -> None:
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert {n: k for n, k in long.items() if k > MAX_LINES} == {}


def test_no_function_over_60_lines() -> None:
    """From its `def` to its last line, docstring included: a function that needs more is two steps."""
    long = {
        f"{name}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
        for name, path in _modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    }
    assert max(long.values()) > 40  # premise: the walk sees the functions
    assert {f: n for f, n in long.items() if n > MAX_FUNCTION_LINES} == {}


def test_the_config_is_read_through_its_own_api() -> None:
    """Outside config.py (and settings.py, which builds the typed sections from it) nothing looks a key up
    by name: what a value means (the store shown, a default) is config's or the settings' to say."""
    mods = _modules()
    lookups = {n for n, p in mods.items() if re.search(r"\bcfg\.get\(", p.read_text())}
    assert lookups - {f"{PKG}.config", f"{PKG}.settings"} == set()


def test_few_any_annotations() -> None:
    count = sum(len(re.findall(r":\s*Any\b", p.read_text())) for p in _modules().values())
    assert count < MAX_ANY, f"{count} `: Any` annotations (type what is known)"


def test_the_verbs_reach_a_capability_through_its_front_door() -> None:
    """`bootseer ckpt` and `bootseer hot` know one module of their capability's package, its `actions`:
    the package's parts can move without the command layer changing (as envsnap's verbs do mostly)."""
    mods = _modules()
    for command, package in (("ckpt", "stripe"), ("hot", "hotblocks")):
        name = f"{PKG}.commands.{command}"
        reached = {m for m in _imports(name, mods[name], set(mods)) if m.startswith(f"{PKG}.{package}.")}
        assert reached == {f"{PKG}.{package}.actions"}, name


# Who may write "bootseer: warning:" by hand: the one `warn()` (redact.py, so every warning is redacted) and
# prewarm (its lines go to the caller's echo). cache.py and store.py keep theirs until they move into the
# store package (issue 47 item 4), where they call `warn()` too.
_HAND_WARNINGS = {"redact.py", "prewarm.py", "cache.py", "store.py"}


def test_one_warn_for_every_warning() -> None:
    by_hand = {n for n, p in _modules().items() if "bootseer: warning:" in p.read_text()}
    assert {n for n in by_hand if _modules()[n].name not in _HAND_WARNINGS} == set()


def test_no_function_that_nothing_calls() -> None:
    """A module-level function whose name appears nowhere in the package but at its `def` is dead, or called
    by tests only (what tests call must be what bootseer runs). Decorated ones are registered, not named:
    the typer verbs. Names inside strings count: the capability table's "module:function" targets."""
    texts = {name: path.read_text() for name, path in _modules().items()}
    words = Counter(w for text in texts.values() for w in re.findall(r"\w+", text))
    unnamed = [
        f"{name}.{node.name}"
        for name, text in texts.items()
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.decorator_list
        and words[node.name] == 1
    ]
    assert unnamed == []
