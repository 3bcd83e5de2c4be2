"""The package's structure, checked on its source: no import circle anywhere (imports only a type checker reads, under
`if TYPE_CHECKING:`, do not count: they never run), and no module writes another object's underscored field (an
object's private state has one owner: its own class; ctypes' `_fields_`-style protocol names are not private)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"moeslots": ROOT / "moeslots", "moeslots.engine": ROOT / "engine", "moeslots.profiles": ROOT / "profiles",
            "moeslots.tui": ROOT / "tui"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, d in PACKAGES.items():
        for f in d.rglob("*.py"):
            parts = list(f.relative_to(d).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = f
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            lines |= {m.lineno for m in ast.walk(n) if hasattr(m, "lineno")}
    return lines


def _imports(name: str, f: Path, mods: dict[str, Path]) -> set[str]:
    tree = ast.parse(f.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    base = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
    deps: set[str] = set()
    for n in ast.walk(tree):
        if getattr(n, "lineno", None) in skip:
            continue
        if isinstance(n, ast.ImportFrom):
            target = ".".join(base[:len(base) - (n.level - 1)] + ([n.module] if n.module else [])) if n.level \
                else (n.module or "")
            for a in n.names:
                deps.add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
        elif isinstance(n, ast.Import):
            deps |= {a.name for a in n.names}
    return {d for d in deps if d in mods and d != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    mods = _modules()
    graph = {m: _imports(m, f, mods) for m, f in mods.items()}
    assert graph["moeslots.engine.runtime.engine"] >= {"moeslots.engine.runtime.residency",
                                                       "moeslots.engine.llm.model"}   # (it reads)
    assert _cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _private_writes(f: Path) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign,
                                                                                            ast.AnnAssign)) else []
        for t in targets:
            for x in ast.walk(t):
                if (isinstance(x, ast.Attribute) and x.attr.startswith("_") and not x.attr.endswith("_")
                        and not (isinstance(x.value, ast.Name) and x.value.id in ("self", "cls"))):
                    out.append(f"{f.relative_to(ROOT)}:{x.lineno} {ast.unparse(x)}")
    return out


def test_no_module_writes_another_objects_private_fields() -> None:
    found = [w for f in _modules().values() for w in _private_writes(f)]
    assert found == [], "\n".join(found)


def test_a_private_write_is_found(tmp_path: Path) -> None:
    f = ROOT / "tests" / "_probe_private_write.py"
    try:
        f.write_text("class A:\n    def f(self, other):\n        self._mine = 1\n        other._theirs = 2\n"
                     "        other.x._deep += 1\n        other._fields_ = []\n")
        assert [w.split(" ", 1)[1] for w in _private_writes(f)] == ["other._theirs", "other.x._deep"]
    finally:
        f.unlink()
