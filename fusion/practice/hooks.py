"""pytest hooks for a practice workspace (used by ``tests/conftest.py``).

* A test of phase M stopped by the TODO(human) of another phase N is not wrong, it is waiting for Phase N: it is
  reported as skipped "needs Phase N", so that pytest fails exactly in the tests of the unsolved phases. A TODO of
  the test's own phase stays a failure.
* A hypothesis test that hits a TODO stub stops at its first example (a stub fails on every input).
* In a workspace, hypothesis never shrinks: a wrong solution's first failing example is reported at once (shrinking
  it cost minutes per phase). In the reference, failures are still shrunk to their minimal example.

In the reference no TODO is ever raised or printed, so the first two hooks change nothing there.
"""

from __future__ import annotations

import functools
import re
import traceback

from fusion.practice.markers import _TODO_MESSAGE

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
        frames = [
            f for f in traceback.extract_tb(exc.todo.__traceback__) if f.filename != __file__
        ]  # hide this wrapper
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
# Hypothesis in a workspace: report the first failing example, do not shrink it


def practice_profile(base: str) -> str:
    """Register and return the hypothesis profile a workspace runs with: ``base`` (dev/ci/thorough) without the
    shrink phase, stopping at the first failing example. A learner's wrong solution then fails in seconds, with
    the example that broke it, instead of minutes of shrinking."""
    from hypothesis import Phase, settings

    settings.register_profile(
        "practice",
        parent=settings.get_profile(base),
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        report_multiple_bugs=False,
    )
    return "practice"


def _exc_message(exc: BaseException) -> str:
    if isinstance(getattr(exc, "todo", None), NotImplementedError):
        return _exc_message(exc.todo)
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _exc_message(exc.exceptions[0])
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:1000]
