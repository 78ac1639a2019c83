"""``practice check``: run the phases' tests once, tally them per phase, and say honestly where the learner stands.

"All done" only when the run covered every phase of a workspace and every phase passed. A run over some phases
says which pass and what is still to do; in the reference checkout it says it is not a workspace. "Next" is the
first phase still to do: when it has an open TODO(human), the one its lesson stops at (so the lesson and the checker
point at the same line); when every TODO of it is filled in but a test fails, that test and the phase's code, never
a later phase's TODO.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fusion.practice.hooks import _exc_message, failure_todos, item_phase
from fusion.practice.markers import PracticeError
from fusion.practice.workspace import Todo, is_workspace, package_root, scan_todos

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
        self.selected: dict[int, list[str]] = {}  # phase → the node ids that run (after -m and any sample)

    def pytest_collection_finish(self, session) -> None:
        for item in session.items:
            self.selected.setdefault(item_phase(item) or 0, []).append(item.nodeid)

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


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    err = [line for line in lines if line.startswith("E ")]
    return (err[-1] if err else lines[-1] if lines else "").strip()[:300]


def phase_test_files(root: Path, phases: Sequence[int]) -> list[str]:
    """The test files that name one of ``phases``' markers (``phase8`` as a word). A test in any other file carries
    no such marker, so collecting only these selects exactly the tests ``-m`` selects from all of them, without
    importing every other test module (each imports torch, torchvision, ...: ~15 s a check for the whole suite)."""
    return marker_test_files(root, [f"phase{n}" for n in phases])


def marker_test_files(root: Path, markers: Sequence[str]) -> list[str]:
    """The files of ``root/tests`` that name one of ``markers`` as a word (``phase8``, ``tooling``)."""
    words = [re.compile(rf"\b{re.escape(m)}\b") for m in markers]
    files = sorted((root / "tests").glob("test_*.py"))
    return [str(f) for f in files if any(w.search(f.read_text(encoding="utf-8")) for w in words)]


def pytest_args(root: Path, phases: Sequence[int]) -> list[str]:
    """The arguments ``check`` gives pytest for ``phases``: ``uv run pytest -m "phaseA or phaseB"`` run in ``root``
    (its addopts, no ``-k``) over the test files that name those markers (:func:`phase_test_files`: the same tests as
    the project's testpaths give), plus flags that change only what is printed and where (-n 0: in this process,
    see _NO_WORKERS). One definition of a phase's tests: check N runs the tests that ``pytest -m phaseN`` runs."""
    return [
        "--rootdir",
        str(root),
        "-p",
        "no:cacheprovider",
        "-m",
        " or ".join(f"phase{n}" for n in phases),
        "--tb=no",
        "-rN",
        "-q",
        *_NO_WORKERS,
        *phase_test_files(root, phases),
    ]


# pytest-xdist's workers (the project's addopts ask for two) would run the tests where this process's tally cannot see
# them: check runs every test here (-n 0). Without xdist installed there is no -n to turn off.
_NO_WORKERS = ("-n", "0") if importlib.util.find_spec("xdist") is not None else ()


def run_tests(
    root: Path, phases: Sequence[int], first_failure: bool = False, sample: int | None = None
) -> tuple[_Tally, int]:
    """Run the tests of ``phases`` in this process (``pytest -m "phaseA or phaseB"`` in ``root``, see
    :func:`pytest_args`) and tally them per phase. The hypothesis profile is the one ``uv run pytest`` loads there
    (tests/conftest.py: HYPOTHESIS_PROFILE, else "ci" under CI=true, else "dev"; in a workspace without shrinking).

    ``sample``: run only the first ``sample`` tests of each phase (CI's round trip, which tests the tally and the
    verdicts; the full tests of the same code run in the reference).
    """
    import pytest

    class Sample:
        @pytest.hookimpl(trylast=True)  # after -m has deselected the other phases
        def pytest_collection_modifyitems(self, config, items) -> None:
            seen: dict[int | None, int] = {}
            keep, drop = [], []
            for item in items:
                p = item_phase(item)
                seen[p] = seen.get(p, 0) + 1
                (keep if seen[p] <= sample else drop).append(item)
            if drop:
                config.hook.pytest_deselected(items=drop)
                items[:] = keep

    tally = _Tally(first_failure)
    cwd = os.getcwd()
    os.chdir(root)  # pytest's testpaths apply when it runs from the rootdir, as `uv run pytest` there does
    try:
        code = int(pytest.main(pytest_args(root, phases), plugins=[tally] + ([Sample()] if sample else [])))
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


def verdict(
    statuses: dict[int, str], everything: Sequence[int], todos: Sequence[Todo], workspace: bool, root: Path
) -> tuple[bool, str]:
    """(all done?, the closing sentence) for a check run whose phases got ``statuses`` (phase → "✓", "✗ …", …).

    ``everything`` is every phase of the course. "All done" needs a workspace, a run over every phase, and ✓ for
    each; a run over some phases says which pass, which are still to do (failing, or with an open TODO(human)) and
    which were not tested this run.
    """
    checked = sorted(statuses)
    passing = [n for n in checked if statuses[n] == "✓"]
    if not workspace:
        return False, (
            f"This is not a practice workspace: {root} has no .practice.json, so its solutions are the "
            f"reference's own. Checked: the reference's tests of phase {_numbers(checked)} "
            f"({_numbers(passing) or 'none'} pass). To practise: uv run python -m fusion.practice start "
            "../fusion-practice, then check there."
        )
    open_phases = {t.phase for t in todos if t.open}
    todo = sorted({n for n in checked if statuses[n] != "✓"} | {n for n in open_phases if n not in statuses})
    unchecked = [n for n in everything if n not in statuses and n not in open_phases]
    if not todo and not unchecked:
        return True, "All done: every phase passes its tests. Compare with the reference: see README, 'Practice'."
    parts = []
    if passing:
        parts.append(f"Phase {_numbers(passing)} pass{'es' if len(passing) == 1 else ''}")
    if todo:
        parts.append(f"still to do: {_numbers(todo)}")
    text = "; ".join(parts) or "Nothing checked passes"
    if unchecked:
        text += (
            f". Not tested this run: phase {_numbers(unchecked)} (TODOs filled in); "
            "`uv run python -m fusion.practice check` tests every phase"
        )
    return False, text + "."


def _numbers(ns: Sequence[int]) -> str:
    return ", ".join(map(str, ns))


def lesson_stop(module: str) -> tuple[str, int] | None:
    """Where ``python -m fusion.<module> --quick`` stops at an unsolved TODO(human): (path, line), or None when it
    runs through (or fails some other way). The lesson's output is swallowed."""
    from fusion.common import is_todo, todo_site

    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            importlib.import_module(f"fusion.{module}").run(quick=True)
    except NotImplementedError as e:
        return todo_site(e) if is_todo(e) else None
    except Exception:  # noqa: BLE001 - a lesson broken by the learner's code: the file order decides instead
        return None
    return None


def next_todo(todos: Sequence[Todo], stop: tuple[str, int] | None = None) -> Todo | None:
    """The next open TODO: the one a lesson stopped at (``stop``, from :func:`lesson_stop`) when that is an open
    TODO, else the first of the lowest phase with one, in file order."""
    open_todos = [t for t in todos if t.open]
    hit = [t for t in open_todos if stop is not None and (t.path, t.line) == stop]
    return hit[0] if hit else (open_todos[0] if open_todos else None)


def find_next(todos: Sequence[Todo]) -> tuple[Todo, str] | tuple[None, None]:
    """The next TODO and the lesson module that reaches it: the lesson of the lowest phase with an open TODO is
    run (what the learner runs next), and where it stops is "Next"."""
    from fusion.main import PHASES

    first = next_todo(todos)
    if first is None:
        return None, None
    module = next(p.module for p in PHASES if p.number == first.phase)
    return next_todo(todos, lesson_stop(module)), module


def first_unsolved(statuses: dict[int, str], todos: Sequence[Todo]) -> int | None:
    """The lowest phase still to do: checked and not ✓ (failing, waiting, no tests), or with an open TODO(human)."""
    todo = {n for n, s in statuses.items() if s != "✓"} | {t.phase for t in todos if t.open}
    return min(todo) if todo else None


def show_failing_phase(number: int, module: str, t: PhaseTally | None, todos: Sequence[Todo], status: str) -> None:
    """ "Next" for a phase whose TODOs are all filled in but whose tests do not pass: its first failure, its code."""
    if status.startswith("…"):
        why = f"its tests wait for {status.removeprefix('… needs ')}"
    else:
        why = status.removeprefix("✗").strip() or "its tests fail"
    print(f"\nNext: Phase {number}: every TODO(human) is filled in, but {why}")
    if t and t.failures:
        first = t.failures[0]
        more = f" (and {t.failed - 1} more)" if t.failed > 1 else ""
        print(f"  first failing test{more}: {first['nodeid']}\n    {first['message']}")
    for todo in (todo for todo in todos if todo.phase == number):
        print(f"  your code: {todo.path}:{todo.line}  {todo.task}")
    print(f"  tests: uv run pytest -m phase{number}   lesson: uv run python -m fusion.{module}")
    print(f"  stuck?  uv run python -m fusion.practice hint {number}")


def check(
    phases: Sequence[int] | None = None,
    first_failure: bool = False,
    json_path: str | None = None,
    root: Path | None = None,
    sample: int | None = None,
) -> int:
    """Run the phases' tests, print a ✓/✗ table, the verdict and the next unsolved TODO(human).

    0 when every phase that ran is ✓ (the exit status says whether the tests passed; the verdict says whether the
    course is done).
    """
    from fusion.common import table
    from fusion.main import PHASES

    root = root or package_root()
    known = [p.number for p in PHASES]
    wanted = list(dict.fromkeys(phases)) if phases else known
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise PracticeError(f"no phase {unknown}; the phases are {known}")
    workspace = is_workspace(root)
    todos = scan_todos(root)
    start_time = time.perf_counter()
    tally, code = run_tests(root, wanted, first_failure, sample)
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

    done, sentence = verdict(statuses, known, todos, workspace, root)
    if sample:
        sentence += f" (sampled: the first {sample} tests of each phase, for CI's round trip)"
    print(f"\n{sentence}")
    # Next: the first phase still to do. With an open TODO, the one its lesson stops at; with every TODO filled
    # in (a wrong solution), its first failing test: never a later phase's TODO while an earlier phase fails.
    next_phase = first_unsolved(statuses, todos) if workspace and not done else None
    nxt, module = None, None
    if next_phase is not None and any(t.open and t.phase == next_phase for t in todos):
        nxt, module = find_next(todos)
    if nxt is not None:
        print(f"\nNext: Phase {nxt.phase}, {nxt.path}:{nxt.line}\n  TODO(human): {nxt.task}")
        print(f"  lesson: uv run python -m fusion.{module}   tests: uv run pytest -m phase{nxt.phase}")
        print(f"  stuck?  uv run python -m fusion.practice hint {nxt.phase}")
    elif next_phase is not None:
        module = next(p.module for p in PHASES if p.number == next_phase)
        status = statuses.get(next_phase, "✗")
        show_failing_phase(next_phase, module, tally.tally.get(next_phase), todos, status)

    ok = code in (0, 5) and not tally.collection_errors and all(s == "✓" for s in statuses.values())
    if json_path:
        import fusion

        result = {
            "fusion_file": fusion.__file__,
            "workspace": workspace,
            "pytest_exit_code": code,
            "collection_errors": tally.collection_errors,
            "phases": {str(n): asdict(t) for n, t in tally.tally.items()},
            "selected": {str(n): ids for n, ids in sorted(tally.selected.items())},
            "status": {str(n): s for n, s in statuses.items()},
            "all_done": done,
            "sample": sample,
            "verdict": sentence,
            "next": asdict(nxt) if nxt is not None else None,
            "next_phase": nxt.phase if nxt is not None else next_phase,
            "todos": [asdict(t) for t in todos],
            "seconds": seconds,
        }
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if ok else 1
