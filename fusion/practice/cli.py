"""The command line: ``python -m fusion.practice start | check | hint | lint``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fusion.practice.markers import PracticeError
from fusion.practice.progress import check, next_todo
from fusion.practice.workspace import Workspace, package_root, scan_reference, scan_todos, start

# ----------------------------------------------------------------------------------------------------------------------
# hint, lint, the command line


def hint(phase: int | None = None, root: Path | None = None, more: bool = False) -> int:
    """Print a phase's tasks with the first level of hint (what to look at); ``more``: also the second level (the
    idea, the API to read about). Never the solution. The workspace's files show each task with its first hint; the
    second level is asked for. Default phase: the one of the next open TODO."""
    from fusion.main import PHASES

    root = root or package_root()
    todos = scan_todos(root)
    if phase is None:
        nxt = next_todo(todos)
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
        print(f"{i}. [{'open' if t.open else 'done'}] {t.path}:{t.line}\n   task: {t.task}")
        print(f"   hint: {t.hint or '(none given: read the lesson above it)'}")
        if more:
            print(f"   more: {t.more or '(no second level for this one: the hint and the docstring above it are all)'}")
        print()
    if not more and any(t.more for t in mine):
        print(f"Still stuck? uv run python -m fusion.practice hint {phase} --more   (the idea, the API to read about)")
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
    for r in plan.regions:
        if not r.more:
            print(f"note: {r.path}:{r.todo_line}: no second-level hint ('. More: <the idea, the API to read about>')")
    return 1 if plan.warnings else 0


# ----------------------------------------------------------------------------------------------------------------------
# Command line


def _numbers(text: str) -> list[int]:
    try:
        return [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of phase numbers: {text!r} (e.g. 1,2,3)") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fusion.practice",
        description="Learner mode: write an exercise workspace, check your progress, get hints.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="write the exercise workspace to DIR (absent or empty)")
    s.add_argument("dir")
    s.add_argument(
        "--solved", metavar="N[,N]", type=_numbers, default=[], help="phases to start solved (reference code kept)"
    )
    c = sub.add_parser("check", help="run each phase's tests; ✓/✗ per phase and the next TODO(human)")
    c.add_argument("phases", nargs="*", type=int, help="only these phases (default: all)")
    c.add_argument("-x", "--first-failure", action="store_true", help="stop each phase at its first failing test")
    c.add_argument("--json", metavar="PATH", help="also write the results as JSON (used by CI)")
    c.add_argument("--sample", metavar="K", type=int, help=argparse.SUPPRESS)  # CI's round trip: K tests per phase
    h = sub.add_parser("hint", help="phase N's tasks and hints (default: the phase of the next open TODO)")
    h.add_argument("phase", nargs="?", type=int)
    h.add_argument("--more", action="store_true", help="also the second level: the idea, the API to read about")
    sub.add_parser("lint", help="(authors) validate the learner-region markers and list the regions")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            plan = start(args.dir, solved=args.solved)
            _print_started(plan, Path(args.dir))
            return 0
        if args.command == "check":
            return check(args.phases, args.first_failure, args.json, sample=args.sample)
        if args.command == "hint":
            return hint(args.phase, more=args.more)
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
    print("  uv run python -m fusion.practice check      # progress, and where the next TODO is")
    print("  uv run python -m fusion.<phase>             # the lesson that Next names: read it, fill its TODO(human)")
    print("  uv run python -m fusion.practice hint N     # stuck? a hint; --more for the second level")
