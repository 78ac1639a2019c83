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


BESIDE_THE_LAYERS = {"common"}  # shared plumbing every layer and lesson uses (tables, reports, the lesson CLI)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between fusion's subpackages (``fusion.kernels`` -> ``fusion.ir``), lessons and
    ``fusion.common`` left out (it stands beside the layers: :func:`test_common_is_plumbing_beside_the_layers`)."""

    def folder(mod: str) -> str | None:
        parts = mod.split(".")
        if len(parts) < 2 or parts[1] in BESIDE_THE_LAYERS:
            return None
        return parts[1] if (FUSION / parts[1] / "__init__.py").exists() else None

    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        if (src := folder(mod)) is not None:
            out.setdefault(src, set()).update(f for d in deps if (f := folder(d)) not in (None, src))
    return out


def test_no_import_cycle_between_folders():
    """A folder is a layer: ir (the hand-off records) <- kernels (renderers, runtimes) <- compiler (the pipeline).
    A cycle between folders (compiler -> kernels -> compiler) means the layers are not layers."""
    graph = folder_graph(import_graph())
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between folders: " + " -> ".join(cycle)
    assert graph["kernels"] - {"ir", "aten"} == set(), "fusion.kernels depends on the IR (and aten helpers) alone"
    assert "compiler" not in graph["ir"] | graph["kernels"]


def test_common_is_plumbing_beside_the_layers():
    """fusion.common (tracing errors, tables, reports, rewrite clean-up, TODO handling, the lesson CLI) is used by every
    layer and imports none of them: its one way out is the lesson CLI's lazy look-up of a lesson's picture
    (fusion.viz, whose package module imports nothing of fusion)."""
    graph = import_graph()
    out = sorted(
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        if mod == "fusion.common" or mod.startswith("fusion.common.")
        for dep in deps
        if not dep.startswith("fusion.common") and (mod, dep) != ("fusion.common.cli", "fusion.viz")
    )
    assert not out, out
    assert graph["fusion.viz"] == set()


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


# ----------------------------------------------------------------------------------------------------------------------
# One definition of a phase's tests: each test carries exactly one phase marker (phase1 … phase10) or `tooling`, so
# `pytest -m phaseN` (and `practice check N`, which runs exactly that) never runs a test of another phase.

TESTS = FUSION.parent / "tests"
PHASE_MARKS = {f"phase{p.number}" for p in PHASES} | {"tooling"}


def marks_in(expr: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
    """The ``pytest.mark.<name>`` names an expression applies: a mark, a call of one, a list, a name bound to one."""
    found = set()
    for n in ast.walk(expr):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark":
            if isinstance(n.value.value, ast.Name) and n.value.value.id == "pytest":
                found.add(n.attr)
        elif isinstance(n, ast.Name) and n.id in aliases:
            found |= aliases[n.id]
    return found


def phase_marks_of_tests(source: str) -> dict[str, set[str]]:
    """Each test function of a test module (``Class::test`` for methods) → its phase/tooling markers, from the module's
    ``pytestmark``, its class (decorators, ``pytestmark``) and its own decorators (parametrize's marks included)."""
    tree = ast.parse(source)
    aliases: dict[str, set[str]] = {}
    module: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            marks = marks_in(node.value, aliases)
            if node.targets[0].id == "pytestmark":
                module |= marks
            elif marks:
                aliases[node.targets[0].id] = marks

    def decorated(fn: ast.AST) -> set[str]:
        return set().union(*(marks_in(d, aliases) for d in fn.decorator_list))

    found: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            found[node.name] = (module | decorated(node)) & PHASE_MARKS
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            own = decorated(node) | {
                m
                for s in node.body
                if isinstance(s, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
                for m in marks_in(s.value, aliases)
            }
            for s in node.body:
                if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name.startswith("test"):
                    found[f"{node.name}::{s.name}"] = (module | own | decorated(s)) & PHASE_MARKS
    return found


def test_the_marker_reader_sees_module_class_function_and_alias_marks():
    source = (
        "import pytest\n"
        "pytestmark = [pytest.mark.phase8, pytest.mark.skipif(False, reason='x')]\n"
        "NINE = pytest.mark.phase9\n"
        "def test_a(): pass\n"
        "@NINE\n@pytest.mark.parametrize('x', [1])\ndef test_b(x): pass\n"
        "@pytest.mark.tooling\nclass TestC:\n    def test_d(self): pass\n"
        "def helper(): pass\n"
    )
    assert phase_marks_of_tests(source) == {
        "test_a": {"phase8"},
        "test_b": {"phase8", "phase9"},
        "TestC::test_d": {"phase8", "tooling"},
    }


def test_every_test_has_exactly_one_phase_marker():
    """A test marked with two phases runs under both `-m`s: after a correct Phase 8, `pytest -m phase8` would fail on a
    test that needs Phase 9's solution (issue 41). A test with no marker runs under no phase's check."""
    problems = []
    files = sorted(TESTS.glob("test_*.py"))
    assert files, f"no test files under {TESTS}"
    for path in files:
        for test, marks in phase_marks_of_tests(path.read_text(encoding="utf-8")).items():
            if len(marks) != 1:
                problems.append(f"tests/{path.name}::{test}: {sorted(marks) or 'no phase marker'}")
    assert not problems, "each test needs exactly one of phase1..phase10 or tooling:\n" + "\n".join(problems)
