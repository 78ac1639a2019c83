"""The package's layout: each lesson file is a lesson (short enough to read), and imports inside fusion/ form no cycle.

Every import counts, the lazy ones inside functions too: a cycle through a function-level import is still a
dependency that points back.
"""

import ast
import sys
from pathlib import Path

import pytest

from fusion.main import PHASES

pytestmark = pytest.mark.tooling

FUSION = Path(__file__).resolve().parents[1] / "fusion"
MAX_LESSON_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(FUSION.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(FUSION.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The fusion modules that ``name`` imports (absolute or relative, at module level or inside functions)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from fusion import x` imports the submodule fusion.x when there is one, else a name of fusion
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import fusion.kernels.cublaslt as k` -> that module; a name -> its module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None. Depth-first search with three colours."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is not a cycle


def test_the_import_walker_sees_relative_lazy_and_from_package_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "fusion"
    (pkg / "bench").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "lesson.py": "from fusion.bench import report\n",
        "bench/__init__.py": "from . import report\n",
        "bench/report.py": "def f():\n    from fusion import lesson\n",  # a lazy import pointing back
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "FUSION", pkg)
    graph = import_graph()
    assert graph["fusion.lesson"] == {"fusion.bench.report"}
    assert graph["fusion.bench"] == {"fusion.bench.report"}
    assert graph["fusion.bench.report"] == {"fusion.lesson"}
    assert find_cycle(graph) == ["fusion.bench.report", "fusion.lesson", "fusion.bench.report"]


def test_no_import_cycle_inside_fusion():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.module)
def test_each_lesson_file_reads_in_one_sitting(phase):
    path = FUSION / f"{phase.module}.py"
    assert path.is_file(), f"phase {phase.number}'s lesson file {path.name} is missing"
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LESSON_LINES, (
        f"fusion/{path.name} has {n} lines (at most {MAX_LESSON_LINES}): move machinery a learner need not read "
        "into a subpackage beside the lessons"
    )


def test_machinery_never_imports_a_lesson():
    """Dependencies point from lessons to machinery: nothing in a subpackage of fusion/ (kernels, bench, aten,
    fxutils, compiler, demo_models, practice) imports a lesson module, lazily or not. (fusion.bench runs the lessons'
    passes as benchmark variants through importlib, by name, so that an unsolved phase becomes a row with its
    reason.)"""
    lessons = {f"fusion.{p.module}" for p in PHASES}
    graph = import_graph()
    backwards = sorted(
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        if mod.count(".") >= 2 or (mod.count(".") == 1 and (FUSION / mod.split(".")[1] / "__init__.py").exists())
        for dep in deps & lessons
    )
    assert not backwards, backwards
