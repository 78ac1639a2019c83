"""The workspace: which files make it, which phase a file belongs to, ``start``, and the TODOs open or done.

Learner regions live only in the lesson files ``fusion/<module>.py`` of ``fusion.main.PHASES``. Everything else
(``fusion/kernels/``, ``fusion/bench/``, this package, ``common/``, the tests) is plumbing and is copied unchanged.
The workspace's ``.practice.json`` records every region's phase, file, task and hints, taken from the reference at
``start``: the task list never depends on the learner keeping a ``# TODO(human)`` comment.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fusion.practice.markers import (
    BEGIN,
    SKIP_NAMES,
    SKIP_SUFFIXES,
    STUB_RE,
    TODO_PREFIX,
    TOP_DIRS,
    TOP_FILES,
    WORKSPACE_FILE,
    MarkerError,
    PracticeError,
    Region,
    comments,
    split_todo,
    strip_file,
    stub_line,
)

# ----------------------------------------------------------------------------------------------------------------------
# The tree: which files, which phase


def package_root() -> Path:
    """The project root of the ``fusion`` package being run (the reference checkout, or a workspace)."""
    return Path(__file__).resolve().parents[2]


def phase_modules() -> dict[str, int]:
    """module name → phase number, from fusion.main.PHASES."""
    from fusion.main import PHASES

    return {p.module: p.number for p in PHASES}


def phase_of(relpath: str, modules: dict[str, int]) -> int | None:
    """The phase of a lesson file ``fusion/<module>.py``; None for every other file (subpackages included)."""
    parts = relpath.split("/")
    if len(parts) != 2 or parts[0] != "fusion" or not parts[1].endswith(".py"):
        return None
    return modules.get(parts[1].removesuffix(".py"))


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
        "`TODO(human)`, then `uv run python -m fusion.practice check`.\n"
        "> Each `TODO(human)` line shows its task alone. Stuck? `uv run python -m fusion.practice hint N` gives the "
        "first hint (what to look at), `hint N --more` the second (the idea, the API to read about).\n\n"
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
            {
                "phase": r.phase,
                "path": r.path,
                "line": plan.stub_lines[(r.path, r.todo_line)] - 1,
                "task": r.task,
                "hint": r.hint,
                "more": r.more,
            }
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


def workspace_info(root: Path | None = None) -> dict | None:
    """The workspace's ``.practice.json`` (None in the reference, or when it cannot be read)."""
    path = (root or package_root()) / WORKSPACE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Todo:
    phase: int
    path: str
    line: int  # the TODO(human) comment (or the stub itself when the comment is gone)
    task: str
    hint: str
    open: bool  # its stub is still there
    more: str = ""  # the second level of hint


def scan_todos(root: Path | None = None, modules: dict[str, int] | None = None) -> list[Todo]:
    """Every TODO(human) task, in phase and file order; ``open`` while its stub is still in place.

    In a workspace the tasks come from ``.practice.json`` (written from the reference at ``start``): deleting a
    ``# TODO(human)`` comment, or the stub with it, does not lose the task. In the reference (or a workspace from
    an older version without the record) they are read from the comments.
    """
    root = root or package_root()
    info = workspace_info(root)
    if info is not None and info.get("regions") and all("hint" in r for r in info["regions"]):
        return _todos_from_record(root, info["regions"])
    modules = phase_modules() if modules is None else modules
    todos = []
    for rel in _lesson_files(root, modules):
        text = (root / rel).read_text(encoding="utf-8")
        lines = text.splitlines()
        try:
            todo_comments = {c.line: c for c in comments(text, rel) if c.alone and c.text.startswith(TODO_PREFIX)}
        except MarkerError:  # the learner's code does not tokenize: still report its stubs
            todo_comments = {}
        claimed = set()
        for n, c in todo_comments.items():
            task, hint, more = split_todo(c.text)
            nxt = next((k for k in range(n, len(lines)) if lines[k].strip()), None)  # 0-based index of next code line
            is_open = nxt is not None and STUB_RE.match(lines[nxt]) is not None
            if is_open:
                claimed.add(nxt + 1)
            todos.append(Todo(modules[rel[len("fusion/") : -3]], rel, n, task, hint, is_open, more))
        for i, line in enumerate(lines, 1):
            m = STUB_RE.match(line)
            if m and i not in claimed:
                todos.append(Todo(int(m.group("phase")), rel, i, _stub_task(m), "", True))
    return sorted(todos, key=lambda t: (t.phase, t.path, t.line))


def _lesson_files(root: Path, modules: dict[str, int]) -> list[str]:
    return [
        f"fusion/{m}.py" for m in sorted(modules, key=lambda m: modules[m]) if (root / "fusion" / f"{m}.py").is_file()
    ]


def _stub_task(m) -> str:
    return m.group("task").split(". Hint: uv run python -m fusion.practice hint")[0]


def _todos_from_record(root: Path, records: list[dict]) -> list[Todo]:
    """The recorded tasks, each open while its stub (the exact line ``start`` wrote) is still in its file."""
    todos = []
    by_path: dict[str, list[dict]] = {}
    for r in records:
        by_path.setdefault(r["path"], []).append(r)
    for rel, recs in by_path.items():
        try:
            lines = (root / rel).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        claimed: set[int] = set()
        for r in recs:
            stub = stub_line("", r["phase"], r["task"])
            at = next((i for i, line in enumerate(lines) if i not in claimed and line.strip() == stub), None)
            if at is not None:
                claimed.add(at)
                above = lines[at - 1].strip() if at else ""
                line = at if above.startswith(TODO_PREFIX) else at + 1  # 1-based: the TODO line, else the stub
            else:  # solved (or deleted): point at its TODO comment if it is still there
                line = next(
                    (
                        i
                        for i, text in enumerate(lines, 1)
                        if text.strip().startswith(TODO_PREFIX) and split_todo(text.strip())[0] == r["task"]
                    ),
                    r["line"],
                )
            todos.append(Todo(r["phase"], rel, line, r["task"], r["hint"], at is not None, r.get("more", "")))
    return sorted(todos, key=lambda t: (t.phase, t.path, t.line))


def lesson_texts(reference: Path, modules: dict[str, int] | None = None) -> dict[str, str]:
    """The reference's lesson files, ``{relative path: text}``: a snapshot for :func:`solve`."""
    modules = phase_modules() if modules is None else modules
    return {rel: (reference / rel).read_text(encoding="utf-8") for rel in _lesson_files(reference, modules)}


def solve(
    root: Path,
    phases: Iterable[int],
    reference: Path,
    modules: dict[str, int] | None = None,
    texts: dict[str, str] | None = None,
) -> int:
    """(CI, authors) Fill the open stubs of ``phases`` in the workspace ``root`` with the reference's code, as a
    learner who copied the solution would (``texts``: the reference's lesson files as read at ``start``).
    Returns how many stubs were replaced."""
    phases = set(phases)
    modules = phase_modules() if modules is None else modules
    texts = lesson_texts(reference, modules) if texts is None else texts
    replaced = 0
    for rel, text in texts.items():
        phase = modules[rel[len("fusion/") : -3]]
        if phase not in phases or not (root / rel).is_file():
            continue
        ref_lines = text.splitlines(keepends=True)
        _, regions, _, _ = strip_file("".join(ref_lines), rel, phase)
        lines = (root / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        for r in regions:
            at = next((i for i, line in enumerate(lines) if line.rstrip("\r\n") == r.stub), None)
            if at is not None:
                body = ref_lines[r.begin : r.end - 1]
                if at and lines[at - 1].rstrip("\r\n") == r.todo:  # the task-only TODO line: the reference's again
                    lines[at - 1 : at + 1] = [ref_lines[r.todo_line - 1], *body]
                else:
                    lines[at : at + 1] = body
                replaced += 1
        (root / rel).write_text("".join(lines), encoding="utf-8")
    return replaced
