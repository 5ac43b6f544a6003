"""The shape of the code (issues 24 and 47): no import circle, even through imports inside functions or
under `TYPE_CHECKING` (a circle that only the type checker sees is still two modules that need each
other); the modules on floors, each importing only from its own floor or below, with at most one known
arrow back up; no module over 600 lines; at most ten `: Any` and `-> Any` annotations. Read from the
source with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "bootseer_cli"
MAX_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_ANY = 10  # `: Any` and `-> Any` together (issue 47): what is dynamic (a resolved target, a proxy)

# The floors, lowest first, by top-level module or package (`store` is the whole store/ package). A
# module imports from its own floor or below; a new module needs a floor here (DESIGN.md section 9).
FLOORS: tuple[tuple[str, frozenset[str]], ...] = tuple(
    (name, frozenset(units.split()))
    for name, units in (
        (
            "ground: pure helpers and the capability table's strings",
            "errors redact units digests procs progress safeopen paths nodedirs gcpause readahead reqfiles"
            " settingspec templates capabilities domains",
        ),
        ("settings, trust and what they derive", "settings trust config keys launcher"),
        ("the store", "store freshness unverified"),
        ("services every capability uses", "events delivery p2p upkeep identity containers stage agent gc"),
        ("the capabilities", "envsnap envmount hotblocks stripe compilecache report firststep ckpt"),
        ("the pipeline, its checks and store-wide actions", "launch doctor resign"),
        (
            "the front: verbs, commands, entry points, the public API, the references generated from them",
            "verbs commands cli entry __main__ __init__ reference",
        ),
    )
)
# The arrows that run back up, and why (at most one): gc deletes a checkpoint's stripes on the targets
# the stripe catalog knows.
KNOWN_UP = {("bootseer_cli.gc", "bootseer_cli.stripe.catalog")}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports: at the top, inside functions and under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & known  # `from . import capabilities`
            out.update(subs)
            if target in known and len(subs) < len(node.names):  # a name of the module itself
                out.add(target)
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


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _unit(module: str) -> str:
    """The floor's unit of a module: its top-level module or package under bootseer_cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _arrows_up(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    floor = {unit: i for i, (_, units) in enumerate(FLOORS) for unit in units}
    return {(a, b) for a, targets in graph.items() for b in targets if floor[_unit(b)] > floor[_unit(a)]}


def test_no_import_circle() -> None:
    graph = _graph()
    assert sum(len(v) for v in graph.values()) > 100  # premise: the walk sees the imports
    assert _cycles(graph) == []


def test_the_walk_finds_a_circle_through_a_function(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\ndef f():\n    from .b import x\n"
        "from . import d\n"
    )
    assert _imports("pkg.a", tmp_path / "a.py", {"pkg", "pkg.b", "pkg.c", "pkg.d"}) == {"pkg.b", "pkg.c", "pkg.d"}


def test_every_module_has_a_floor() -> None:
    placed = set().union(*(units for _, units in FLOORS))
    assert {_unit(m) for m in _modules()} - placed == set()
    assert sum(len(units) for _, units in FLOORS) == len(placed)  # each on one floor


def test_at_most_one_arrow_back_up_the_floors() -> None:
    up = _arrows_up(_graph())
    assert len(KNOWN_UP) <= 1
    assert up <= KNOWN_UP, f"imports from a higher floor: {sorted(up - KNOWN_UP)}"
    assert up == KNOWN_UP, f"gone, drop from KNOWN_UP: {sorted(KNOWN_UP - up)}"


def test_the_floors_see_an_arrow_up() -> None:
    graph = {"bootseer_cli.errors": {"bootseer_cli.store.core"}, "bootseer_cli.store.core": {"bootseer_cli.errors"}}
    assert _arrows_up(graph) == {("bootseer_cli.errors", "bootseer_cli.store.core")}


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


def test_the_verbs_reach_a_capability_through_its_front_door() -> None:
    """`bootseer ckpt` and `bootseer hot` know one module of their capability's package, its `actions`:
    the package's parts can move without the command layer changing (as envsnap's verbs do mostly)."""
    mods = _modules()
    for command, package in (("ckpt", "stripe"), ("hot", "hotblocks")):
        name = f"{PKG}.commands.{command}"
        reached = {m for m in _imports(name, mods[name], set(mods)) if m.startswith(f"{PKG}.{package}.")}
        assert reached == {f"{PKG}.{package}.actions"}, name


# Who may write "bootseer: warning:" by hand: the one `warn()` (redact.py, so every warning is redacted) and
# prewarm (its lines go to the caller's echo).
_HAND_WARNINGS = {"redact.py", "prewarm.py"}


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


def _any_annotations(text: str) -> int:
    return len(re.findall(r"(?::|->)\s*Any\b", text))


def test_few_any_annotations() -> None:
    count = sum(_any_annotations(p.read_text()) for p in _modules().values())
    assert count <= MAX_ANY, f"{count} `: Any` and `-> Any` annotations (type what is known, or `object`)"


def test_the_count_sees_both_kinds() -> None:
    assert _any_annotations("def f(x: Any, y: dict[str, Any]) -> Any:\n    z:Any = x\n") == 3
