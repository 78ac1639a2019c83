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


def is_machinery(mod: str) -> bool:
    """A module of a subpackage of fusion/ (kernels, bench, aten, fxutils, compiler, ...), not a top-level file."""
    return mod.count(".") >= 2 or (mod.count(".") == 1 and (FUSION / mod.split(".")[1] / "__init__.py").exists())


# A loader: a call whose function's name says it imports or loads a module (importlib.import_module, find_spec,
# __import__, runpy.run_module, a helper such as the former bench.workloads.load_phase(module, phase) or
# compiler.aot.register_once(name, module, attr))
LOADER = ("import", "load", "spec", "run_module", "register_once")
# Machinery whose job is to run the lessons as `python -m fusion.<lesson>` does, from fusion.main's list of phases
RUNNERS = {"fusion.practice.progress": "`practice check` runs each lesson's run() to find where it stops"}


def by_name_imports(source: str, lessons: set[str]) -> list[str]:
    """The calls of a loader in ``source`` that name a lesson: a string naming one (``"fusion.codegen"``,
    ``"codegen"``, ``"fusion/codegen.py"``), an f-string ``f"fusion.{name}"`` that can name any, or ``__name__``
    (a lesson asking the machinery to import it back by name)."""
    stems = {m.removeprefix("fusion.") for m in lessons}
    names = lessons | stems | {f"fusion/{m}.py" for m in stems}
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if not any(word in fn for word in LOADER):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(arg, ast.Name) and arg.id == "__name__":  # a lesson handing its own name to a loader
                found.append((node.lineno, f"line {node.lineno}: {fn}(__name__)"))
            elif isinstance(arg, ast.Constant) and arg.value in names:
                found.append((node.lineno, f"line {node.lineno}: {fn}({arg.value!r})"))
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                if arg.values[0].value in ("fusion.", "fusion/") and len(arg.values) > 1:
                    found.append((node.lineno, f"line {node.lineno}: {fn}({ast.unparse(arg)})"))
    return [text for _, text in sorted(found)]


def test_the_by_name_reader_sees_every_spelling():
    lessons = {"fusion.codegen", "fusion.backend"}
    source = (
        "import importlib, importlib.util\n"
        "importlib.import_module('fusion.codegen')\n"
        "importlib.util.find_spec('fusion.backend')\n"
        "load_phase('backend', 9)\n"
        "def f(m):\n    return __import__(f'fusion.{m}')\n"
        "register_once('fusion', __name__, 'fusion_backend')\n"
        "importlib.import_module('fusion.viz.regions')\n"  # machinery: fine
        "PICTURES = {'fusion.codegen': 'fusion.viz.kernels'}\n"  # a lesson's name as data, loaded by no one: fine
        "importlib.util.find_spec('matplotlib')\n"
    )
    assert [f.split(":")[0] for f in by_name_imports(source, lessons)] == [f"line {n}" for n in (2, 3, 4, 6, 7)]


def test_machinery_never_imports_a_lesson():
    """Dependencies point from lessons to machinery: nothing in a subpackage of fusion/ (kernels, bench, aten,
    fxutils, compiler, demo_models, practice) imports a lesson module, lazily or not, statically or by name
    (importlib, find_spec, a helper taking a lesson's name). A lesson hands the machinery what the learner writes
    through fusion.compiler.registry; the Phase 4 lesson and scripts import the lessons they measure."""
    lessons = {f"fusion.{p.module}" for p in PHASES}
    graph = import_graph()
    backwards = sorted(f"{mod} -> {dep}" for mod, deps in graph.items() if is_machinery(mod) for dep in deps & lessons)
    assert not backwards, backwards
    mods = modules()
    by_name = sorted(
        f"{mod}, {call}"
        for mod, path in mods.items()
        if is_machinery(mod) and mod not in RUNNERS
        for call in by_name_imports(path.read_text(encoding="utf-8"), lessons)
    )
    by_name += sorted(  # a lesson may import lessons, but never hand the machinery its own name to import it back
        f"{mod}, {call}"
        for mod, path in mods.items()
        if mod in lessons
        for call in by_name_imports(path.read_text(encoding="utf-8"), lessons)
        if call.endswith("(__name__)")
    )
    assert not by_name, (
        f"machinery importing a lesson by name (register it instead: fusion.compiler.registry): {by_name}"
    )
    assert set(RUNNERS) <= set(mods), "a runner that no longer exists: drop it from RUNNERS"


def test_each_lesson_registers_what_the_registry_says_it_provides():
    """registry.PROVIDERS names, for every function the machinery asks for, the lesson that provides it; that lesson
    calls registry.register(<its phase>, name=...) at module level, outside any TODO region, so importing it is enough."""
    from fusion.compiler import registry

    phases = {f"fusion.{p.module}": p.number for p in PHASES}
    for name, (phase, module) in registry.PROVIDERS.items():
        assert phases.get(module) == phase, f"{name}: {module} is not Phase {phase}'s lesson"
        tree = ast.parse((FUSION.parent / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
        calls = [
            n.value
            for n in tree.body
            if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and ast.unparse(n.value.func) == "registry.register"
        ]
        given = {k.arg for c in calls if ast.literal_eval(c.args[0]) == phase for k in c.keywords}
        assert name in given, f"{module} does not call registry.register({phase}, {name}=...) at module level"


def test_the_registry_names_the_import_that_registers_a_function(monkeypatch):
    from fusion.compiler import registry

    monkeypatch.setattr(registry, "_functions", {})
    with pytest.raises(
        registry.NotRegistered, match=r"^Phase 8's triton_expr is not registered: import fusion.codegen$"
    ):
        registry.get("triton_expr")
    with pytest.raises(ValueError, match="triton_expr is Phase 8's"):
        registry.register(9, triton_expr=len)
    with pytest.raises(ValueError, match="unknown name 'triton_exrp'"):
        registry.register(8, triton_exrp=len)
    call = registry.lazy("triton_expr")  # looked up when called, not when defined
    registry.register(8, triton_expr=len)
    assert call([1, 2]) == 2 and registry.get("triton_expr") is len


# ----------------------------------------------------------------------------------------------------------------------
# The README's "How a tensor flows" table is the driver's stage list


def readme_stage_rows() -> list[tuple[str, str]]:
    """(stage, module cell) of each row of the README's table under "How a tensor flows through the compiler"."""
    text = (FUSION.parent / "README.md").read_text(encoding="utf-8")
    section = text.split("## How a tensor flows through the compiler", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("|")]
    return [(cells[0].strip(), cells[1]) for cells in rows[2:]]  # past the header and its |---| line


def test_the_readme_table_is_the_drivers_stage_list():
    from fusion.compiler.driver import STAGES

    rows = readme_stage_rows()
    assert [r[0] for r in rows] == [s.name for s in STAGES], "README's table rows must be the driver's STAGES, in order"
    for stage, (_, cell) in zip(STAGES, rows, strict=True):
        assert (FUSION.parent / stage.module).is_file(), f"stage {stage.name}: {stage.module} does not exist"
        assert f"`{stage.module}`" in cell, f"README's row {stage.name!r} does not name `{stage.module}`"


# The import walk of a region: from the driver, through the stage modules in the stage order. A stage module may reach
# (import, through modules that are no stage's, or look up through fusion.compiler.registry) a later stage's module,
# never an earlier one's; the driver, which names every stage, is where the walk starts. Each back-edge the walk meets
# today is listed here with why it is there: fixing one means deleting its line, and a new one fails the test.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}  # none today


def stage_modules() -> list[str]:
    """The driver's STAGES as module names, in stage order, each once."""
    from fusion.compiler.driver import STAGES

    return list(dict.fromkeys(s.module.removesuffix(".py").replace("/", ".") for s in STAGES))


def registry_lookups(source: str) -> set[str]:
    """The lessons a module reaches by name through the registry: ``registry.get("compile_graph")``,
    ``registry.lazy("fold_bn")`` or an alias of either called with a name of ``registry.PROVIDERS``."""
    from fusion.compiler.registry import PROVIDERS

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.args[0], ast.Constant):
            if node.args[0].value in PROVIDERS:
                found.add(PROVIDERS[node.args[0].value][1])
    return found


def walk_graph() -> dict[str, set[str]]:
    """The import graph, plus an edge from each module that imports the registry to the lessons it looks up."""
    graph, mods = import_graph(), modules()
    for name, deps in graph.items():
        if "fusion.compiler.registry" in deps:
            deps |= registry_lookups(mods[name].read_text(encoding="utf-8")) - {name}
    return graph


def stage_walk(graph: dict[str, set[str]], order: list[str], root: str) -> tuple[set[str], list[list[str]]]:
    """(the stage modules the walk from ``root`` enters, its back-edges as paths): from each stage module entered,
    every path through non-stage modules to the next stage module it meets is one step; a step to a module earlier
    in ``order`` than the one it leaves (``root`` aside) is a back-edge."""
    entered, todo, back = set(), [root], []
    while todo:
        here = todo.pop()
        if here in entered:
            continue
        entered.add(here)
        paths, stack = {here: [here]}, [here]
        while stack:  # depth-first through modules that are no stage's
            mod = stack.pop()
            for dep in sorted(graph.get(mod, ())):
                if dep in paths:
                    continue
                paths[dep] = [*paths[mod], dep]
                if dep in order:
                    todo.append(dep)
                    if here != root and order.index(dep) < order.index(here):
                        back.append(paths[dep])
                else:
                    stack.append(dep)
    return entered & set(order), sorted(back)


def test_the_stage_walk_finds_a_back_edge_through_a_helper():
    order = ["s1", "s2", "s3"]
    graph = {"root": {"s1", "s2"}, "s1": {"helper"}, "helper": {"s3"}, "s2": {"s3"}, "s3": set()}
    assert stage_walk(graph, order, "root") == ({"s1", "s2", "s3"}, [])
    graph["s3"] = {"util"}
    graph["util"] = {"s2"}
    assert stage_walk(graph, order, "root") == ({"s1", "s2", "s3"}, [["s3", "util", "s2"]])
    assert registry_lookups("registry.get('triton_expr')\nlesson('fold_bn')\nf('x')") == {
        "fusion.codegen",
        "fusion.backend",
    }


def test_the_import_walk_of_a_region_enters_each_stage_module_once_in_stage_order():
    """From the driver, the README's stage modules are each entered, and no step goes back to an earlier stage's
    module except the known back-edges (each with its reason in KNOWN_BACK_EDGES)."""
    order = stage_modules()
    entered, back = stage_walk(walk_graph(), order, "fusion.compiler.driver")
    assert entered == set(order), f"stage modules the driver's walk never enters: {sorted(set(order) - entered)}"
    found = {(path[0], path[-1]): " -> ".join(path) for path in back}
    new = {edge: path for edge, path in found.items() if edge not in KNOWN_BACK_EDGES}
    assert not new, f"the walk goes back to an earlier stage's module: {sorted(new.values())}"
    gone = sorted(set(KNOWN_BACK_EDGES) - set(found))
    assert not gone, f"fixed back-edges: delete them from KNOWN_BACK_EDGES: {gone}"


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
