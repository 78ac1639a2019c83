"""Learner-region markers: read them (as Python comments), validate them, and strip a file to its exercise.

A region is::

        # TODO(human): <task>. Hint: <level 1: what to look at>. More: <level 2: the idea, the API to read about>
        # BEGIN SOLUTION
        ...reference code...
        # END SOLUTION

and becomes two lines at the same indentation: the TODO line with the task and its first hint (``# TODO(human):
<task>. Hint: <level 1>``), and ``raise NotImplementedError("TODO(human) Phase N: <task>. Hint: uv run python -m
fusion.practice hint N")``. Hints are levels: the file shows the task (which states every rule the tests check) and
the first hint; ``hint N --more`` gives the More text, asked for. Every problem is one :class:`MarkerError` naming
``file:line``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

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
_MORE = re.compile(r"\s*\bMore:\s*")
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


def split_todo(comment: str) -> tuple[str, str, str]:
    """``# TODO(human): <task>. Hint: <hint>. More: <more>`` → (task, hint, more).

    The task loses its final period; the hint and the second level ``more`` may be '' (a line without ``More:``
    is fine: it has one level of hint).
    """
    body = comment[len(TODO_PREFIX) :].strip()
    m = _HINT.search(body)
    task, hint = (body[: m.start()], body[m.end() :]) if m else (body, "")
    m = _MORE.search(hint)
    hint, more = (hint[: m.start()].strip().rstrip(".;,").strip(), hint[m.end() :]) if m else (hint, "")
    return task.strip().rstrip(".;,: ").strip(), hint.strip(), more.strip()


def stub_line(indent: str, phase: int, task: str) -> str:
    """The one statement a region becomes. Quotes and backslashes in the task are escaped, never trusted."""
    msg = f"TODO(human) Phase {phase}: {task}. Hint: uv run python -m fusion.practice hint {phase}"
    literal = '"' + msg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{indent}raise NotImplementedError({literal})"


def todo_comment(indent: str, task: str, hint: str = "") -> str:
    """The TODO line a workspace shows: the task and its first hint (what to look at); the second level is asked
    for (``hint N --more``)."""
    return f"{indent}{TODO_PREFIX} {task}." + (f" Hint: {hint}" if hint else "")


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
    more: str = ""  # the second level of hint ('' when the TODO line has no 'More:' part)

    @property
    def stub(self) -> str:
        return stub_line(self.indent, self.phase, self.task)

    @property
    def todo(self) -> str:
        """Its TODO line in the workspace: the task and the first hint, not the second."""
        return todo_comment(self.indent, self.task, self.hint)


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
                    "learner region outside a lesson file: regions belong in the lesson files fusion/<phase>.py of "
                    "fusion.main.PHASES (machinery subpackages are copied unchanged)",
                )
            task, hint, more = split_todo(begin_todo.text)
            if not task:
                raise MarkerError(path, begin_todo.line, "the TODO(human) line has no task sentence")
            if not hint:
                warnings.append(f"{path}:{begin_todo.line}: TODO(human) line has no 'Hint: <hint>' part")
            if '"' in begin_todo.text or "\\" in begin_todo.text:
                warnings.append(f"{path}:{begin_todo.line}: TODO(human) line holds a double quote or a backslash")
            regions.append(Region(path, phase, begin_todo.line, begin.line, c.line, indent, task, hint, more))
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
    """``text`` with each region's TODO line cut to its task and the region (BEGIN..END, inclusive) replaced by its
    stub; and each stub's 1-based line number (line numbers do not move: the TODO line stays one line)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stub_lines: list[int] = []
    pos = 0  # next reference line (0-based) to copy
    for r in sorted(regions, key=lambda r: r.begin):
        out.extend(lines[pos : r.todo_line - 1])
        first = lines[r.begin - 1]
        newline = first[len(first.rstrip("\r\n")) :] or "\n"
        out.append(r.todo + newline)
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
