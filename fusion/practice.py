"""Learner mode: turn the reference into an exercise workspace, then check progress and give hints.

Run it:
    uv run python -m fusion.practice start ../fusion-practice   # write the exercise workspace (an empty DIR)
    cd ../fusion-practice
    uv run python -m fusion.practice check         # ✓/✗ per phase, tests passing, the next TODO(human)
    uv run python -m fusion.practice check 2 -x    # only Phase 2's tests, stop at its first failure
    uv run python -m fusion.practice hint 2        # Phase 2's tasks and hints, file:line of each
    uv run python -m fusion.practice start DIR --solved 1,2,3   # begin at Phase 4 (reference code kept)
    uv run python -m fusion.practice lint          # (authors) validate the markers, list every region
Test it:  uv run pytest -m tooling tests/test_practice.py

The idea (nbgrader's BEGIN/END SOLUTION, minitorch's per-task markers, rustlings' progress and hints)
---------------------------------------------------------------------------------------------------
The reference solutions in the phase modules are marked as *learner regions*::

        # TODO(human): fuse each Linear whose only user is a ReLU. Hint: node.users, replace_all_uses_with
        # BEGIN SOLUTION
        ...reference code...
        # END SOLUTION

``start`` copies the project (pyproject.toml, uv.lock, README.md, fusion/, tests/, scripts/; never .venv, .git or
caches) and replaces every region, at the same indentation, by one statement::

        # TODO(human): fuse each Linear whose only user is a ReLU. Hint: node.users, replace_all_uses_with
        raise NotImplementedError("TODO(human) Phase 2: fuse each Linear whose only user is a ReLU. Hint: uv run python -m fusion.practice hint 2")

The phase number comes from the module: ``fusion.main.PHASES`` maps phase N to ``fusion/<module>.py`` (or a
``fusion/<module>/`` package). Markers are read as Python *comments* (``tokenize``), so a marker quoted inside a
string or docstring is text, not a marker. Every problem is one error naming the file and line: a region outside a
phase module or outside a function body, nested/unclosed/orphaned markers, a BEGIN without its TODO(human) line
right above, markers at different indentation, an empty region, a region holding its function's only ``yield``.
Each stubbed file is parsed (``ast``) before anything is written, and the reference tree is only ever read.

In the workspace an unsolved region raises ``NotImplementedError("TODO(human) Phase N: ...")``:
``python -m fusion.<phase>`` and ``fusion.main`` turn it into a message (``fusion.common.lesson_cli``), and
``tests/conftest.py`` turns a test of phase M that stops at phase N's TODO (N != M) into a skip "needs Phase N",
so ``pytest`` fails exactly in the tests of the unsolved phases; and a hypothesis test that hits a stub stops at its
first example instead of shrinking (a stub fails on every input; shrinking it cost minutes per phase). The
workspace root carries ``.practice.json`` (where it came from, and its regions); its presence is how the tooling
knows it runs in a workspace.
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import json
import os
import re
import subprocess
import sys
import time
import tokenize
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

BEGIN = "# BEGIN SOLUTION"
END = "# END SOLUTION"
TODO_PREFIX = "# TODO(human):"
WORKSPACE_FILE = ".practice.json"

# What a workspace is made of: these top-level files and directories of the reference, nothing else.
TOP_FILES = ("pyproject.toml", "uv.lock", "README.md", ".gitignore", ".python-version", "LICENSE", "LICENSE.md")
TOP_DIRS = ("fusion", "tests", "scripts")
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".mypy_cache", ".venv", ".git", ".DS_Store"}
SKIP_SUFFIXES = (".pyc", ".pyo")

_LOOSE_MARKER = re.compile(r"#\s*(begin|end)[\s_-]*solution\b", re.IGNORECASE)
_LOOSE_TODO = re.compile(r"#\s*todo\s*\(\s*human\s*\)", re.IGNORECASE)
_HINT = re.compile(r"\s*\bHint:\s*")
_TODO_MESSAGE = re.compile(r"^TODO\(human\) Phase (\d+):")
STUB_RE = re.compile(
    r'^(?P<indent>[ \t]*)raise NotImplementedError\("TODO\(human\) Phase (?P<phase>\d+): (?P<task>.*)"\)[ \t]*$'
)


class PracticeError(Exception):
    """Something the learner (or an author) must fix; the message says what and how."""


class MarkerError(PracticeError):
    """A learner-region marker problem, always naming ``file:line``."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        self.path, self.line, self.problem = path, line, problem
        super().__init__(f"{path}:{line}: {problem}")


# ----------------------------------------------------------------------------------------------------------------------
# Reading markers


@dataclass(frozen=True)
class Comment:
    line: int  # 1-based
    col: int  # its indentation (0-based column of '#')
    text: str  # the comment, '#' included, trailing whitespace stripped
    alone: bool  # nothing but whitespace before it on its line


def comments(text: str, path: str = "<string>") -> list[Comment]:
    """Every comment token of a Python source (strings and docstrings are not comments)."""
    lines = text.splitlines()
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                alone = not lines[row - 1][:col].strip()
                out.append(Comment(row, col, tok.string.rstrip(), alone))
    except (tokenize.TokenError, SyntaxError) as e:  # IndentationError is a SyntaxError
        line = getattr(e, "lineno", None) or (e.args[1][0] if len(e.args) > 1 else 1)
        raise MarkerError(path, line, f"cannot tokenize the file as Python ({e.args[0]})") from None
    return out


def split_todo(comment: str) -> tuple[str, str]:
    """``# TODO(human): <task>. Hint: <hint>`` → (task, hint); the task loses its final period, the hint may be ''."""
    body = comment[len(TODO_PREFIX) :].strip()
    m = _HINT.search(body)
    task, hint = (body[: m.start()], body[m.end() :]) if m else (body, "")
    return task.strip().rstrip(".;,: ").strip(), hint.strip()


def stub_line(indent: str, phase: int, task: str) -> str:
    """The one statement a region becomes. Quotes and backslashes in the task are escaped, never trusted."""
    msg = f"TODO(human) Phase {phase}: {task}. Hint: uv run python -m fusion.practice hint {phase}"
    literal = '"' + msg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{indent}raise NotImplementedError({literal})"


@dataclass(frozen=True)
class Region:
    path: str  # relative, '/'-separated, e.g. "fusion/trace_basics.py"
    phase: int
    todo_line: int  # the TODO(human) comment, 1-based, in the reference file
    begin: int  # the BEGIN SOLUTION line
    end: int  # the END SOLUTION line
    indent: str
    task: str
    hint: str

    @property
    def stub(self) -> str:
        return stub_line(self.indent, self.phase, self.task)


def find_regions(text: str, path: str, phase: int | None) -> tuple[list[Region], list[str]]:
    """The learner regions of one file, validated; and convention warnings (missing hint, quotes on the TODO line).

    ``phase`` is the file's phase number, or None for a file that is not a phase module (any region there is an error).
    Raises :class:`MarkerError` at the first structural problem.
    """
    lines = text.splitlines()
    regions: list[Region] = []
    warnings: list[str] = []
    todo: Comment | None = None  # the TODO(human) line waiting for its BEGIN on the next line
    begin: Comment | None = None  # the open region
    begin_todo: Comment | None = None

    for c in comments(text, path):
        kind = _classify(c, path)
        if kind is None:
            continue
        if todo is not None and not (kind == "begin" and c.line == todo.line + 1):
            raise MarkerError(path, todo.line, f"'{TODO_PREFIX}' line without '{BEGIN}' on the line right below it")
        if kind == "todo":
            if begin is not None:
                raise MarkerError(path, c.line, f"'{TODO_PREFIX}' inside the region opened at line {begin.line}")
            todo = c
        elif kind == "begin":
            if begin is not None:
                raise MarkerError(
                    path, c.line, f"nested '{BEGIN}': the region opened at line {begin.line} is not closed yet"
                )
            if todo is None:
                raise MarkerError(
                    path,
                    c.line,
                    f"'{BEGIN}' needs the line '{TODO_PREFIX} <task>. Hint: <hint>' directly above it",
                )
            if todo.col != c.col:
                raise MarkerError(path, c.line, f"'{BEGIN}' is not at the indentation of its TODO(human) line")
            begin, begin_todo, todo = c, todo, None
        else:  # end
            if begin is None:
                raise MarkerError(path, c.line, f"'{END}' without a '{BEGIN}' before it")
            if c.col != begin.col:
                raise MarkerError(
                    path, c.line, f"'{END}' is not at the indentation of its '{BEGIN}' (line {begin.line})"
                )
            body = [(n, lines[n - 1]) for n in range(begin.line + 1, c.line) if lines[n - 1].strip()]
            if not body:
                raise MarkerError(path, begin.line, "empty region: put the reference code between the markers")
            indent = lines[begin.line - 1][: begin.col]
            assert begin_todo is not None
            if phase is None:
                raise MarkerError(
                    path,
                    begin.line,
                    "learner region outside a phase module: regions belong in the modules of fusion.main.PHASES",
                )
            task, hint = split_todo(begin_todo.text)
            if not task:
                raise MarkerError(path, begin_todo.line, "the TODO(human) line has no task sentence")
            if not hint:
                warnings.append(f"{path}:{begin_todo.line}: TODO(human) line has no 'Hint: <hint>' part")
            if '"' in begin_todo.text or "\\" in begin_todo.text:
                warnings.append(f"{path}:{begin_todo.line}: TODO(human) line holds a double quote or a backslash")
            regions.append(Region(path, phase, begin_todo.line, begin.line, c.line, indent, task, hint))
            begin = begin_todo = None
    if todo is not None:
        raise MarkerError(path, todo.line, f"'{TODO_PREFIX}' line without '{BEGIN}' on the line right below it")
    if begin is not None:
        raise MarkerError(path, begin.line, f"unclosed '{BEGIN}': add '{END}' at the same indentation")
    return regions, warnings


def _classify(c: Comment, path: str) -> str | None:
    """'todo', 'begin', 'end' or None; a near-miss spelling or a marker after code is an error."""
    if _LOOSE_MARKER.match(c.text):
        kind = _LOOSE_MARKER.match(c.text).group(1).lower()
        exact = BEGIN if kind == "begin" else END
        if c.text != exact:
            raise MarkerError(path, c.line, f"malformed marker {c.text!r}: write exactly '{exact}'")
    elif _LOOSE_TODO.match(c.text):
        kind = "todo"
        if not c.text.startswith(TODO_PREFIX + " "):
            raise MarkerError(path, c.line, f"malformed TODO line: write '{TODO_PREFIX} <task>. Hint: <hint>'")
    else:
        return None
    if not c.alone:
        raise MarkerError(path, c.line, "a marker must be a comment on a line of its own, not after code")
    return kind


# ----------------------------------------------------------------------------------------------------------------------
# Stripping one file


def strip_text(text: str, regions: Sequence[Region]) -> tuple[str, list[int]]:
    """``text`` with each region (BEGIN..END, inclusive) replaced by its stub; and each stub's 1-based line number."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stub_lines: list[int] = []
    pos = 0  # next reference line (0-based) to copy
    for r in sorted(regions, key=lambda r: r.begin):
        out.extend(lines[pos : r.begin - 1])
        first = lines[r.begin - 1]
        newline = first[len(first.rstrip("\r\n")) :] or "\n"
        out.append(r.stub + newline)
        stub_lines.append(len(out))
        pos = r.end
    out.extend(lines[pos:])
    return "".join(out), stub_lines


def _is_generator(fn: ast.AST) -> bool:
    """Whether a def's own body yields (nested defs, lambdas and classes do not count)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _scopes(tree: ast.AST) -> tuple[dict[int, ast.AST | None], dict[str, ast.AST]]:
    """Each statement line's innermost enclosing def/class (None = module level); and every def by a stable key.

    A def's key is its qualified name plus how many defs of that name came before it, which stripping never changes.
    """
    where: dict[int, ast.AST | None] = {}
    defs: dict[str, ast.AST] = {}
    seen: dict[str, int] = {}

    def visit(node: ast.AST, scope: ast.AST | None, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                where.setdefault(child.lineno, scope)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{qual}.{child.name}" if qual else child.name
                if not isinstance(child, ast.ClassDef):
                    k = seen[name] = seen.get(name, -1) + 1
                    defs[f"{name}#{k}"] = child
                visit(child, child, name)
            else:
                visit(child, scope, qual)

    visit(tree, None, "")
    return where, defs


def strip_file(text: str, path: str, phase: int | None) -> tuple[str, list[Region], list[int], list[str]]:
    """Validate and strip one file: (stubbed text, regions, stub line numbers, warnings).

    Before returning, the stubbed text is parsed; a region that leaves invalid Python, holds a statement indented less
    than its markers, sits at module or class level, or holds its function's only ``yield`` is a
    :class:`MarkerError` naming the region.
    """
    regions, warnings = find_regions(text, path, phase)
    if not regions:
        return text, [], [], warnings
    try:
        old_tree = ast.parse(text, filename=path)
    except SyntaxError as e:
        raise MarkerError(path, e.lineno or 1, f"the reference file is not valid Python ({e.msg})") from None
    for node in ast.walk(old_tree):
        if isinstance(node, ast.stmt):
            for r in regions:
                if r.begin < node.lineno < r.end and node.col_offset < len(r.indent):
                    raise MarkerError(
                        path, node.lineno, f"statement indented less than the markers of the region at line {r.begin}"
                    )
    new, stubs = strip_text(text, regions)
    try:
        new_tree = ast.parse(new, filename=path)
    except SyntaxError as e:
        lineno = e.lineno or stubs[-1]
        bad = min(zip(regions, stubs, strict=True), key=lambda rs: abs(rs[1] - lineno))[0]
        raise MarkerError(
            path, bad.begin, f"with this region replaced by one raise the file is not valid Python ({e.msg})"
        ) from None
    where, new_defs = _scopes(new_tree)
    for r, s in zip(regions, stubs, strict=True):
        scope = where.get(s)
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            level = "class" if isinstance(scope, ast.ClassDef) else "module"
            raise MarkerError(
                path, r.begin, f"region at {level} level: a region must be a block inside a function body"
            )
    _, old_defs = _scopes(old_tree)
    for key, fn in old_defs.items():
        if _is_generator(fn) and key in new_defs and not _is_generator(new_defs[key]):
            r = next(r for r in regions if fn.lineno <= r.begin <= (fn.end_lineno or r.begin))
            raise MarkerError(
                path,
                r.begin,
                f"stubbing turns {fn.name}() from a generator into a plain function: a region must not hold the "
                "function's only yield",
            )
    return new, regions, stubs, warnings


# ----------------------------------------------------------------------------------------------------------------------
# The tree: which files, which phase


def package_root() -> Path:
    """The project root of the ``fusion`` package being run (the reference checkout, or a workspace)."""
    return Path(__file__).resolve().parent.parent


def phase_modules() -> dict[str, int]:
    """module name → phase number, from fusion.main.PHASES."""
    from fusion.main import PHASES

    return {p.module: p.number for p in PHASES}


def phase_of(relpath: str, modules: dict[str, int]) -> int | None:
    """The phase of ``fusion/<module>.py`` or ``fusion/<module>/...``; None for every other file."""
    parts = relpath.split("/")
    if len(parts) < 2 or parts[0] != "fusion":
        return None
    name = parts[1].removesuffix(".py") if len(parts) == 2 else parts[1]
    return modules.get(name)


def _wanted(relpath: str) -> bool:
    parts = relpath.split("/")
    if any(p in SKIP_NAMES for p in parts) or relpath.endswith(SKIP_SUFFIXES):
        return False
    return relpath in TOP_FILES if len(parts) == 1 else parts[0] in TOP_DIRS


def project_files(root: Path) -> list[str]:
    """The files a workspace is made of, relative to ``root``: tracked or untracked-but-not-ignored files (git), or a
    walk of ``TOP_DIRS`` without caches when ``root`` is not a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = {n for n in out.split("\0") if n}
    except (OSError, subprocess.CalledProcessError):
        names = set()
        for top in TOP_DIRS:
            for dirpath, dirnames, filenames in os.walk(root / top):
                dirnames[:] = [d for d in dirnames if d not in SKIP_NAMES]
                names.update((Path(dirpath) / f).relative_to(root).as_posix() for f in filenames)
        names.update(f for f in TOP_FILES if (root / f).is_file())
    return sorted(n for n in names if _wanted(n) and (root / n).is_file() and not (root / n).is_symlink())


@dataclass
class Workspace:
    """A workspace, planned in memory: every file's bytes, the regions, and convention warnings."""

    root: Path
    files: dict[str, bytes] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    stub_lines: dict[tuple[str, int], int] = field(default_factory=dict)  # (path, reference TODO line) → stub line
    warnings: list[str] = field(default_factory=list)
    solved: list[Region] = field(default_factory=list)  # regions of phases started as solved (reference code kept)


def scan_reference(root: Path, modules: dict[str, int] | None = None, solved: Iterable[int] = ()) -> Workspace:
    """Read the reference at ``root`` and plan the workspace. Nothing is written; the reference is only read.

    The regions of the ``solved`` phases keep their reference code (only the BEGIN/END marker lines go): a workspace
    that starts further along the course, and the way CI checks one phase solved alone.
    """
    solved = set(solved)
    modules = phase_modules() if modules is None else modules
    if (root / WORKSPACE_FILE).exists():
        raise PracticeError(
            f"{root} is a practice workspace, not the reference: run `start` from the reference checkout"
        )
    if not (root / "pyproject.toml").is_file() or not (root / "fusion").is_dir():
        raise PracticeError(
            f"{root} is not the fusion source tree (no pyproject.toml and fusion/): run from a checkout"
        )
    plan = Workspace(root)
    for rel in project_files(root):
        data = (root / rel).read_bytes()
        if rel.endswith(".py"):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise MarkerError(rel, 1, "not UTF-8 text") from None
            new, regions, stubs, warnings = strip_file(text, rel, phase_of(rel, modules))
            plan.warnings += warnings
            if regions and regions[0].phase in solved:
                markers = {n for r in regions for n in (r.begin, r.end)}
                lines = text.splitlines(keepends=True)
                plan.solved += regions
                data = "".join(line for n, line in enumerate(lines, 1) if n not in markers).encode("utf-8")
            elif regions:
                plan.regions += regions
                for r, s in zip(regions, stubs, strict=True):
                    plan.stub_lines[(rel, r.todo_line)] = s
                data = new.encode("utf-8")
        plan.files[rel] = data
    return plan


def _git_commit(root: Path) -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _workspace_readme(reference: bytes, plan: Workspace) -> bytes:
    n = len(plan.regions)
    phases = sorted({r.phase for r in plan.regions})
    head = (
        "> **Practice workspace.** Generated by `python -m fusion.practice start`: the reference solutions of "
        f"{n} `TODO(human)` exercises (phases {', '.join(map(str, phases))}) are replaced by "
        "`raise NotImplementedError(...)`.\n"
        "> The loop: read a phase's lesson (`uv run python -m fusion.<phase>` and its module, top to bottom), fill a "
        "`TODO(human)`, then `uv run python -m fusion.practice check`. Stuck? `uv run python -m fusion.practice hint N`.\n\n"
    )
    return head.encode("utf-8") + reference


def start(
    dest: str | os.PathLike[str],
    root: Path | None = None,
    modules: dict[str, int] | None = None,
    solved: Iterable[int] = (),
) -> Workspace:
    """Write the exercise workspace to ``dest`` (absent or empty). Validates everything before writing anything.

    ``solved``: phases that start solved, with the reference code in place (e.g. to begin at Phase 4).
    """
    root = (root or package_root()).resolve()
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PracticeError(f"{dest} exists and is not an empty directory: choose a new DIR (start never overwrites)")
    if dest == root or root in dest.parents:
        raise PracticeError(
            f"{dest} is inside the reference tree {root}: choose a DIR outside it, e.g. ../fusion-practice"
        )
    modules = phase_modules() if modules is None else modules
    unknown = sorted(set(solved) - set(modules.values()))
    if unknown:
        raise PracticeError(f"--solved: no phase {unknown}; the phases are {sorted(set(modules.values()))}")
    plan = scan_reference(root, modules, solved)
    if not plan.regions and not plan.solved:
        raise PracticeError(f"no learner regions ('{BEGIN}') found under {root / 'fusion'}")
    if "README.md" in plan.files:
        plan.files["README.md"] = _workspace_readme(plan.files["README.md"], plan)
    info = {
        "generated_by": "python -m fusion.practice start",
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "reference": str(root),
        "reference_commit": _git_commit(root),
        "solved_phases": sorted({r.phase for r in plan.solved}),
        "regions": [
            {"phase": r.phase, "path": r.path, "line": plan.stub_lines[(r.path, r.todo_line)] - 1, "task": r.task}
            for r in plan.regions
        ],
    }
    plan.files[WORKSPACE_FILE] = (json.dumps(info, indent=2) + "\n").encode("utf-8")

    dest.mkdir(parents=True, exist_ok=True)
    for rel, data in plan.files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        src = root / rel
        if src.exists():
            os.chmod(target, src.stat().st_mode & 0o777)
    return plan


# ----------------------------------------------------------------------------------------------------------------------
# In a workspace: the TODOs, open or done


def is_workspace(root: Path | None = None) -> bool:
    return ((root or package_root()) / WORKSPACE_FILE).is_file()


@dataclass(frozen=True)
class Todo:
    phase: int
    path: str
    line: int  # the TODO(human) comment (or the stub itself when the comment is gone)
    task: str
    hint: str
    open: bool  # its stub is still there


def scan_todos(root: Path | None = None, modules: dict[str, int] | None = None) -> list[Todo]:
    """Every TODO(human) of the phase modules, in phase and file order; ``open`` while its stub is still in place."""
    root = root or package_root()
    modules = phase_modules() if modules is None else modules
    todos = []
    files = sorted(
        p.relative_to(root).as_posix() for p in (root / "fusion").rglob("*.py") if "__pycache__" not in p.parts
    )
    for rel in files:
        phase = phase_of(rel, modules)
        if phase is None:
            continue
        text = (root / rel).read_text(encoding="utf-8")
        lines = text.splitlines()
        try:
            todo_comments = {c.line: c for c in comments(text, rel) if c.alone and c.text.startswith(TODO_PREFIX)}
        except MarkerError:  # the learner's code does not tokenize: still report its stubs
            todo_comments = {}
        claimed = set()
        for n, c in todo_comments.items():
            task, hint = split_todo(c.text)
            nxt = next((k for k in range(n, len(lines)) if lines[k].strip()), None)  # 0-based index of next code line
            is_open = nxt is not None and STUB_RE.match(lines[nxt]) is not None
            if is_open:
                claimed.add(nxt + 1)
            todos.append(Todo(phase, rel, n, task, hint, is_open))
        for i, line in enumerate(lines, 1):
            m = STUB_RE.match(line)
            if m and i not in claimed:
                task = m.group("task").split(". Hint: uv run python -m fusion.practice hint")[0]
                todos.append(Todo(int(m.group("phase")), rel, i, task, "", True))
    return sorted(todos, key=lambda t: (t.phase, t.path, t.line))


# ----------------------------------------------------------------------------------------------------------------------
# Tests: which phase a test belongs to, and "needs Phase N" for a test stopped by another phase's TODO


def todo_phases(exc: BaseException | None) -> set[int] | None:
    """The phases whose TODO(human) stubs raised ``exc`` (an exception group counts if *all* its leaves are TODOs)."""
    if exc is None:
        return None
    if isinstance(getattr(exc, "todo", None), NotImplementedError):  # a TodoStop carrying the TODO out of hypothesis
        return todo_phases(exc.todo)
    if isinstance(exc, BaseExceptionGroup):
        found: set[int] = set()
        for sub in exc.exceptions:
            phases = todo_phases(sub)
            if phases is None:
                return None
            found |= phases
        return found or None
    m = _TODO_MESSAGE.match(str(exc)) if isinstance(exc, NotImplementedError) else None
    return {int(m.group(1))} if m else None


_PRINTED_TODO = re.compile(r"^[ \t]*(TODO\(human\) Phase (\d+): .*)$", re.MULTILINE)


def printed_todos(text: str) -> dict[int, str]:
    """TODO(human) messages that a lesson runner printed (``lesson_cli``/``fusion.main`` catch them): phase → line."""
    found: dict[int, str] = {}
    for m in _PRINTED_TODO.finditer(text or ""):
        found.setdefault(int(m.group(2)), m.group(1))
    return found


def failure_todos(exc: BaseException | None, report=None) -> tuple[set[int], str] | None:
    """The phases whose TODO(human) stopped a failed test, and the TODO message; None for any other failure.

    Either the test's exception is a TODO stub's NotImplementedError, or the test called a lesson's command line
    (which turns a TODO into a printed message and exit status 1) and the TODO message is on a line of its own in
    the exception's message (e.g. an assert that shows the command's stderr) or in the test's captured output.
    """
    phases = todo_phases(exc)
    if phases:
        return phases, _exc_message(exc)
    in_message = printed_todos(str(exc)) if exc is not None and not isinstance(exc, BaseExceptionGroup) else {}
    if in_message:
        first = in_message[min(in_message)]
        return set(in_message), f"{first} (in the message of {type(exc).__name__})"
    if exc is not None and id(exc) in _PRINTED_SEEN and _PRINTED_SEEN[id(exc)][0] is exc:
        return _PRINTED_SEEN[id(exc)][1]  # a failed module/session fixture re-raises its error, without the output
    if report is None or not getattr(report, "failed", False):
        return None
    printed = printed_todos(f"{getattr(report, 'capstdout', '')}\n{getattr(report, 'capstderr', '')}")
    if not printed:
        return None
    first = printed[min(printed)]
    found = set(printed), f"{first} (printed by the lesson; the test saw {_exc_message(exc) if exc else 'a failure'})"
    if exc is not None:
        _PRINTED_SEEN[id(exc)] = (exc, found)
    return found


_PRINTED_SEEN: dict[int, tuple[BaseException, tuple[set[int], str]]] = {}


def item_phase(item) -> int | None:
    """The N of a test's ``phaseN`` marker (None for tooling tests)."""
    for mark in item.iter_markers():
        m = re.fullmatch(r"phase(\d+)", mark.name)
        if m:
            return int(m.group(1))
    return None


_TODO_STOP: type | None = None


def _todo_stop() -> type:
    """``TodoStop``: a pytest skip exception carrying a TODO(human) NotImplementedError (pytest imported lazily)."""
    global _TODO_STOP
    if _TODO_STOP is None:
        import pytest

        class TodoStop(pytest.skip.Exception):
            """Hypothesis re-raises skip exceptions at once, without the shrinking it spends on a failure (seconds
            per test, minutes per phase, for a stub that fails the same way on every input). tests/conftest.py
            turns the report back into what it is: a failure of the test's own phase, or a skip "needs Phase N"."""

            def __init__(self, todo: BaseException) -> None:
                super().__init__(str(todo))
                self.todo = todo

        _TODO_STOP = TodoStop
    return _TODO_STOP


def stop_hypothesis_at_todo(items) -> None:
    """Wrap each hypothesis test's ``.hypothesis.inner_test`` (hypothesis' documented hook) so that a TODO(human)
    stub ends it at the first example. Any other exception, and every passing run, goes through unchanged."""
    for item in items:
        handle = getattr(getattr(item, "obj", None), "hypothesis", None)
        inner = getattr(handle, "inner_test", None)
        if inner is None or getattr(inner, "_stops_at_todo", False):
            continue

        def run(*args, __inner=inner, **kwargs):
            __tracebackhide__ = True
            try:
                return __inner(*args, **kwargs)
            except (NotImplementedError, BaseExceptionGroup) as e:
                if todo_phases(e):
                    raise _todo_stop()(e) from e
                raise

        functools.update_wrapper(run, inner)
        run._stops_at_todo = True
        handle.inner_test = run


def adjust_report(item, call, report) -> None:
    """tests/conftest.py's makereport hook: a test stopped by another phase's TODO becomes a skip "needs Phase N";
    a TODO carried out of hypothesis by TodoStop becomes the failure it is, with the stub's traceback."""
    needs = blocked_by(item, call, report)
    if needs is not None and (report.failed or report.skipped):
        _, lineno, _ = item.location
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (lineno or 0) + 1, f"Skipped: {needs[1]}")
        return
    exc = call.excinfo.value if call.excinfo is not None else None
    if _TODO_STOP is not None and isinstance(exc, _TODO_STOP):
        report.outcome = "failed"
        frames = [f for f in traceback.extract_tb(exc.todo.__traceback__) if f.filename != __file__]
        tb = "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames)])
        tb += "".join(traceback.format_exception_only(exc.todo)).rstrip()
        report.longrepr = (
            f"{_exc_message(exc.todo)}\n(hypothesis stopped at the first example: a stub fails on every input)\n\n{tb}"
        )


def blocked_by(item, call, report=None) -> tuple[int, str] | None:
    """(N, message) when a test of phase M stopped at the TODO(human) of another phase N; None otherwise.

    Used by tests/conftest.py to report such a test as skipped ("needs Phase N") instead of failed: the test is not
    wrong, it is waiting for an earlier exercise. A TODO of the test's own phase stays a failure. In the reference no
    TODO is ever raised or printed, so this is always None there.
    """
    if call.excinfo is None:
        return None
    own = item_phase(item)
    found = failure_todos(call.excinfo.value, report)
    if own is None or not found or own in found[0]:
        return None
    phases = found[0]
    n = min(phases)
    return n, f"needs Phase {n}: solve its TODO(human) first (uv run python -m fusion.practice hint {n})"


# ----------------------------------------------------------------------------------------------------------------------
# check: run every phase's tests once, tally per phase


@dataclass
class PhaseTally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    blocked: dict[int, int] = field(default_factory=dict)  # needs phase N → number of tests
    not_run: int = 0  # skipped by --first-failure after this phase's first failure
    failures: list[dict] = field(default_factory=list)  # nodeid, message, todo phase


class _Tally:
    """A pytest plugin: per-phase outcomes, the message of each failure; optionally stop a phase at its first failure."""

    def __init__(self, first_failure: bool = False) -> None:
        self.first_failure = first_failure
        self.phase: dict[str, int | None] = {}
        self.tally: dict[int, PhaseTally] = {}
        self.collection_errors: list[dict] = []
        self.excs: dict[str, BaseException] = {}

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            self.phase[item.nodeid] = p = item_phase(item)
            if p is not None:
                self.tally.setdefault(p, PhaseTally())

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.collection_errors.append({"nodeid": report.nodeid, "message": _last_line(report.longreprtext)})

    def pytest_runtest_setup(self, item) -> None:
        import pytest

        p = self.phase.get(item.nodeid)
        if self.first_failure and p is not None and self.tally[p].failed:
            self.tally[p].not_run += 1
            pytest.skip(f"not run: Phase {p} already has a failing test (check --first-failure)")

    def pytest_runtest_makereport(self, item, call) -> None:
        if call.excinfo is not None and item.nodeid not in self.excs:
            self.excs[item.nodeid] = call.excinfo.value

    def pytest_runtest_logreport(self, report) -> None:
        p = self.phase.get(report.nodeid)
        if p is None:
            return
        t = self.tally[p]
        if report.failed:
            if not any(f["nodeid"] == report.nodeid for f in t.failures):  # a teardown error after a failure
                exc = self.excs.get(report.nodeid)
                found = failure_todos(exc, report)
                message = found[1] if found else _exc_message(exc) if exc else _last_line(report.longreprtext)
                t.failed += 1
                t.failures.append(
                    {
                        "nodeid": report.nodeid,
                        "when": report.when,
                        "message": message,
                        "todo_phase": (p if p in found[0] else min(found[0])) if found else None,
                    }
                )
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            m = re.search(r"needs Phase (\d+)", reason)
            if m:
                n = int(m.group(1))
                t.blocked[n] = t.blocked.get(n, 0) + 1
            elif "check --first-failure" not in reason:
                t.skipped += 1
        elif report.passed and report.when == "call":
            t.passed += 1


def _exc_message(exc: BaseException) -> str:
    if isinstance(getattr(exc, "todo", None), NotImplementedError):
        return _exc_message(exc.todo)
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _exc_message(exc.exceptions[0])
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:1000]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    err = [line for line in lines if line.startswith("E ")]
    return (err[-1] if err else lines[-1] if lines else "").strip()[:300]


def run_tests(root: Path, phases: Sequence[int], first_failure: bool = False) -> tuple[_Tally, int]:
    """Run the tests of ``phases`` in this process (``pytest -m "phaseA or phaseB"``) and tally them per phase."""
    import pytest

    os.environ.setdefault("HYPOTHESIS_PROFILE", "ci")  # fewer examples than "dev": check is a progress report
    tally = _Tally(first_failure)
    args = [
        str(root / "tests"),
        "--rootdir",
        str(root),
        "-o",
        "addopts=",
        "--strict-markers",
        "-p",
        "no:cacheprovider",
        "-m",
        " or ".join(f"phase{n}" for n in phases),
        "--tb=no",
        "-rN",
        "-q",
    ]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        code = int(pytest.main(args, plugins=[tally]))
    finally:
        os.chdir(cwd)
    return tally, code


def phase_status(number: int, t: PhaseTally | None, open_todos: int, load_errors: bool = False) -> str:
    if t is None or (t.passed + t.failed + sum(t.blocked.values()) == 0):
        if load_errors:
            return "✗ tests did not load"
        return "✗ no tests ran" if open_todos else "? no tests"
    if t.failed:
        return "✗"
    if t.blocked:
        return "… needs " + ", ".join(f"Phase {n}" for n in sorted(t.blocked))
    if open_todos:
        return "✗ TODO left"
    return "✓"


def check(
    phases: Sequence[int] | None = None,
    first_failure: bool = False,
    json_path: str | None = None,
    root: Path | None = None,
) -> int:
    """Run the phases' tests, print a ✓/✗ table and the next unsolved TODO(human). 0 when every phase is ✓."""
    from fusion.common import table
    from fusion.main import PHASES

    root = root or package_root()
    known = [p.number for p in PHASES]
    wanted = list(phases) if phases else known
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise PracticeError(f"no phase {unknown}; the phases are {known}")
    modules = {p.module: p.number for p in PHASES}
    todos = scan_todos(root, modules)
    start_time = time.perf_counter()
    tally, code = run_tests(root, wanted, first_failure)
    seconds = time.perf_counter() - start_time

    rows, statuses = [], {}
    for p in PHASES:
        if p.number not in wanted:
            continue
        mine = [t for t in todos if t.phase == p.number]
        open_n = sum(t.open for t in mine)
        t = tally.tally.get(p.number)
        statuses[p.number] = status = phase_status(p.number, t, open_n, bool(tally.collection_errors))
        total = (t.passed + t.failed + sum(t.blocked.values())) if t else 0
        extra = []
        if t and t.not_run:
            extra.append(f"{t.not_run} not run")
        if t and t.skipped:
            extra.append(f"{t.skipped} skipped")
        for n, k in sorted((t.blocked if t else {}).items()):
            extra.append(f"{k} need Phase {n}")
        rows.append(
            (
                p.number,
                p.module,
                f"{len(mine) - open_n}/{len(mine)}",
                f"{t.passed if t else 0}/{total + (t.not_run if t else 0)}"
                + (f" ({', '.join(extra)})" if extra else ""),
                status,
            )
        )
    print()
    print(table(rows, ["phase", "module", "TODOs done", "tests passed", "status"]))
    for err in tally.collection_errors:
        print(f"\n✗ cannot collect {err['nodeid']}: {err['message']}")
    print(f"\n({seconds:.0f} s; details of one phase: uv run pytest -m phaseN)")

    nxt = next((t for t in todos if t.open and t.phase in wanted), None)
    if nxt is not None:
        module = next(p.module for p in PHASES if p.number == nxt.phase)
        print(f"\nNext: Phase {nxt.phase}, {nxt.path}:{nxt.line}\n  TODO(human): {nxt.task}")
        print(f"  lesson: uv run python -m fusion.{module}   tests: uv run pytest -m phase{nxt.phase}")
        print(f"  stuck?  uv run python -m fusion.practice hint {nxt.phase}")
    else:
        bad = [n for n, s in statuses.items() if s != "✓"]
        if bad:
            print(f"\nEvery TODO(human) is filled in; make the tests pass: uv run pytest -m phase{bad[0]}")
        else:
            print("\nAll done: every phase passes its tests. Compare with the reference: see README, 'Practice'.")

    ok = code in (0, 5) and not tally.collection_errors and all(s == "✓" for s in statuses.values())
    if json_path:
        import fusion

        result = {
            "fusion_file": fusion.__file__,
            "pytest_exit_code": code,
            "collection_errors": tally.collection_errors,
            "phases": {str(n): asdict(t) for n, t in tally.tally.items()},
            "status": {str(n): s for n, s in statuses.items()},
            "todos": [asdict(t) for t in todos],
            "seconds": seconds,
        }
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------------------------------
# hint, lint


def hint(phase: int | None = None, root: Path | None = None) -> int:
    """Print a phase's tasks and hints (default: the phase of the next open TODO)."""
    from fusion.main import PHASES

    root = root or package_root()
    todos = scan_todos(root, {p.module: p.number for p in PHASES})
    if phase is None:
        nxt = next((t for t in todos if t.open), None)
        if nxt is None:
            print("No open TODO(human) left: `uv run python -m fusion.practice hint N` shows phase N's hints anyway.")
            return 0
        phase = nxt.phase
    by_number = {p.number: p for p in PHASES}
    if phase not in by_number:
        raise PracticeError(f"no phase {phase}; the phases are {sorted(by_number)}")
    p = by_number[phase]
    mine = [t for t in todos if t.phase == phase]
    print(f"Phase {phase}: {p.title}")
    print(f"  lesson: uv run python -m fusion.{p.module}   tests: uv run pytest -m phase{phase}\n")
    if not mine:
        print("  (this phase has no TODO(human))")
    for i, t in enumerate(mine, 1):
        state = "open" if t.open else "done"
        print(
            f"{i}. [{state}] {t.path}:{t.line}\n   task: {t.task}\n   hint: {t.hint or '(none given: read the lesson above it)'}\n"
        )
    return 0


def lint(root: Path | None = None) -> int:
    """(Authors) validate every marker of the reference and list its regions per phase. 1 on convention warnings."""
    from fusion.common import table

    root = root or package_root()
    plan = scan_reference(root)
    rows = [(r.phase, f"{r.path}:{r.todo_line}", r.end - r.begin - 1, r.task) for r in plan.regions]
    print(table(sorted(rows), ["phase", "TODO(human)", "lines", "task"]))
    for w in plan.warnings:
        print(f"warning: {w}")
    return 1 if plan.warnings else 0


# ----------------------------------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusion.practice", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="write the exercise workspace to DIR (absent or empty)")
    s.add_argument("dir")
    s.add_argument("--solved", metavar="N[,N]", default="", help="phases to start solved (reference code kept)")
    c = sub.add_parser("check", help="run each phase's tests; ✓/✗ per phase and the next TODO(human)")
    c.add_argument("phases", nargs="*", type=int, help="only these phases (default: all)")
    c.add_argument("-x", "--first-failure", action="store_true", help="stop each phase at its first failing test")
    c.add_argument("--json", metavar="PATH", help="also write the results as JSON (used by CI)")
    h = sub.add_parser("hint", help="phase N's tasks and hints (default: the phase of the next open TODO)")
    h.add_argument("phase", nargs="?", type=int)
    sub.add_parser("lint", help="(authors) validate the learner-region markers and list the regions")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            plan = start(args.dir, solved=[int(n) for n in args.solved.split(",") if n.strip()])
            _print_started(plan, Path(args.dir))
            return 0
        if args.command == "check":
            return check(args.phases, args.first_failure, args.json)
        if args.command == "hint":
            return hint(args.phase)
        return lint()
    except PracticeError as e:
        print(f"practice {args.command}: error: {e}", file=sys.stderr)
        return 2


def _print_started(plan: Workspace, dest: Path) -> None:
    from fusion.common import table

    counts: dict[int, int] = {}
    for r in plan.regions:
        counts[r.phase] = counts.get(r.phase, 0) + 1
    files: dict[int, set[str]] = {}
    for r in plan.regions:
        files.setdefault(r.phase, set()).add(r.path)
    rows = sorted((n, ", ".join(sorted(files[n])), k) for n, k in counts.items())
    print(table(rows, ["phase", "file", "TODO(human)"]))
    if plan.solved:
        print(
            f"Started solved (reference code kept): phase {', '.join(map(str, sorted({r.phase for r in plan.solved})))}"
        )
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"\nWrote {len(plan.files)} files to {dest} ({len(plan.regions)} exercises). Next:")
    print(f"  cd {dest}")
    print("  uv run python -m fusion.main --list        # the phases")
    print("  uv run python -m fusion.trace_basics        # read the first lesson, then fill its TODO(human)")
    print("  uv run python -m fusion.practice check      # progress, and where the next TODO is")


if __name__ == "__main__":
    from fusion.practice import main as _main  # one module object, shared with tests/conftest.py under check

    raise SystemExit(_main())
