"""fusion.practice: the marker stripper, the workspace writer, and the full learner round trip.

The round trip (generate a workspace from this reference, run its lessons and tests with this interpreter) runs on
every CI run; in a practice workspace it is skipped (a workspace has no regions left to strip).
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import pytest

from fusion import practice
from fusion.main import PHASES
from fusion.practice import MarkerError, PracticeError
from fusion.practice.progress import marker_test_files

pytestmark = pytest.mark.tooling

pytest_plugins = ["pytester"]

HINT = "uv run python -m fusion.practice hint"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# ----------------------------------------------------------------------------------------------------------------------
# The stripper


NESTED = src(
    '''
    """A docstring quoting the markers is text, not a region:
    # BEGIN SOLUTION
    # END SOLUTION
    """


    class Pass:
        def run(self, xs):
            out = []
            for x in xs:
                if x is not None:
                    # TODO(human): double every x that is not None. Hint: x * 2, then out.append
                    # BEGIN SOLUTION
                    y = x * 2
                    out.append(y)
                    # END SOLUTION
            return out


    def second(a):
        # TODO(human): return a plus one. Hint: the + operator
        # BEGIN SOLUTION
        return (
            a
            + 1
        )
        # END SOLUTION
    '''
)


def test_stub_keeps_indentation_todo_line_and_everything_else():
    new, regions, stubs, warns = practice.strip_file(NESTED, "fusion/lesson.py", 3)
    assert warns == []
    assert [(r.todo_line, r.begin, r.end) for r in regions] == [(12, 13, 16), (21, 22, 27)]
    assert [r.task for r in regions] == ["double every x that is not None", "return a plus one"]
    assert [r.hint for r in regions] == ["x * 2, then out.append", "the + operator"]
    old_lines, new_lines = NESTED.splitlines(), new.splitlines()
    assert new_lines[stubs[0] - 1] == (
        " " * 16 + f'raise NotImplementedError("TODO(human) Phase 3: double every x that is not None. Hint: {HINT} 3")'
    )
    assert new_lines[stubs[1] - 1] == (
        " " * 4 + f'raise NotImplementedError("TODO(human) Phase 3: return a plus one. Hint: {HINT} 3")'
    )
    for stub, r in zip(stubs, regions, strict=True):  # the TODO line stays, right above its stub: task and first hint
        assert new_lines[stub - 2] == old_lines[r.todo_line - 1].split(". More:")[0]
    assert (
        new_lines[stubs[0] - 2]
        == " " * 16 + "# TODO(human): double every x that is not None. Hint: x * 2, then out.append"
    )
    # nothing else changes: the file is the reference minus the regions' lines, plus one line each
    assert len(new_lines) == len(old_lines) - sum(r.end - r.begin for r in regions)
    assert new_lines[: regions[0].todo_line - 1] == old_lines[: regions[0].todo_line - 1]
    assert new_lines[stubs[0] : stubs[1] - 2] == old_lines[regions[0].end : regions[1].todo_line - 1]
    assert new_lines[stubs[1] :] == old_lines[regions[1].end :]
    assert "y = x * 2" not in new and "+ 1" not in new
    assert "# BEGIN SOLUTION" in new.split('"""')[1]  # the docstring is untouched

    ns: dict = {}
    exec(compile(new, "fusion/lesson.py", "exec"), ns)
    assert ns["Pass"]().run([None]) == []  # the stub is not reached: nothing runs at import or without need
    with pytest.raises(NotImplementedError, match=r"^TODO\(human\) Phase 3: double every x") as info:
        ns["Pass"]().run([1])
    assert str(info.value).endswith(f"Hint: {HINT} 3")
    with pytest.raises(NotImplementedError, match=r"^TODO\(human\) Phase 3: return a plus one"):
        ns["second"](1)


def test_reference_code_runs_unchanged():
    ns: dict = {}
    exec(compile(NESTED, "fusion/lesson.py", "exec"), ns)
    assert ns["Pass"]().run([1, None, 2]) == [2, 4] and ns["second"](1) == 2


def test_tabs_and_crlf_are_kept():
    text = "def f():\r\n\t# TODO(human): do it. Hint: h\r\n\t# BEGIN SOLUTION\r\n\treturn 1\r\n\t# END SOLUTION\r\n"
    new, _, stubs, _ = practice.strip_file(text, "fusion/lesson.py", 1)
    assert new.split("\r\n")[stubs[0] - 1].startswith('\traise NotImplementedError("TODO(human) Phase 1: do it.')
    assert new.count("\r\n") == 3


def test_quotes_and_backslashes_are_escaped_and_warned():
    text = src(
        """
        def f(d):
            # TODO(human): read d["key"] and strip \\n. Hint: d.get
            # BEGIN SOLUTION
            return d["key"]
            # END SOLUTION
        """
    )
    new, _, _, warns = practice.strip_file(text, "fusion/lesson.py", 2)
    ns: dict = {}
    exec(new, ns)
    with pytest.raises(NotImplementedError) as info:
        ns["f"]({})
    assert str(info.value) == f'TODO(human) Phase 2: read d["key"] and strip \\n. Hint: {HINT} 2'
    assert len(warns) == 1 and "fusion/lesson.py:2" in warns[0] and "double quote" in warns[0]


def test_split_todo():
    assert practice.split_todo("# TODO(human): fuse it. Hint: node.users") == ("fuse it", "node.users", "")
    assert practice.split_todo("# TODO(human): fuse it; Hint: a. b.") == ("fuse it", "a. b.", "")
    assert practice.split_todo("# TODO(human): fuse it.") == ("fuse it", "", "")
    # two levels of hint: 'More:' is the second (the API calls, the shape of the loop)
    assert practice.split_todo("# TODO(human): fuse it. Hint: node.users. More: a for loop; replace_all_uses_with") == (
        "fuse it",
        "node.users",
        "a for loop; replace_all_uses_with",
    )


def test_missing_hint_is_a_warning_naming_file_and_line():
    text = "def f():\n    # TODO(human): do it.\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n"
    _, regions, _, warns = practice.strip_file(text, "fusion/lesson.py", 1)
    assert regions[0].task == "do it" and regions[0].hint == ""
    assert warns == ["fusion/lesson.py:2: TODO(human) line has no 'Hint: <hint>' part"]


TODO = "# TODO(human): do it. Hint: h"
BAD = {
    "nested": (
        f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    x = 1\n    {TODO}\n    # BEGIN SOLUTION\n"
        "    y = 2\n    # END SOLUTION\n    # END SOLUTION\n",
        5,
        "inside the region opened at line 3",
    ),
    "nested_begin": (
        f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    x = 1\n    # BEGIN SOLUTION\n    # END SOLUTION\n",
        5,
        "nested",
    ),
    "unclosed": (f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    return 1\n", 3, "unclosed"),
    "orphan_end": ("def f():\n    return 1\n    # END SOLUTION\n", 3, "without a '# BEGIN SOLUTION'"),
    "missing_todo": ("def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n", 2, "directly above"),
    "blank_line_after_todo": (
        f"def f():\n    {TODO}\n\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n",
        2,
        "right below",
    ),
    "todo_without_region": (f"def f():\n    {TODO}\n    return 1\n", 2, "right below"),
    "end_indent": (f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    return 1\n  # END SOLUTION\n", 5, "indentation"),
    "todo_indent": (f"def f():\n  {TODO}\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n", 3, "indentation"),
    "empty": (f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n\n    # END SOLUTION\n", 3, "empty region"),
    "module_level": (f"{TODO}\n# BEGIN SOLUTION\nX = 1\n# END SOLUTION\n", 2, "module level"),
    "class_level": (
        f"class A:\n    {TODO}\n    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n",
        3,
        "class level",
    ),
    "after_code": (f"def f():\n    {TODO}\n    x = 1  # BEGIN SOLUTION\n", 3, "line of its own"),
    "malformed": (f"def f():\n    {TODO}\n    #BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n", 3, "malformed"),
    "malformed_todo": ("def f():\n    # TODO(human) do it\n    return 1\n", 2, "malformed TODO"),
    "leaves_block": (
        f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    x = 1\ndef g():\n    pass\n    # END SOLUTION\n",
        5,
        "indented less",
    ),
    "splits_if_else": (
        f"def f(a):\n    {TODO}\n    # BEGIN SOLUTION\n    if a:\n        return 1\n    # END SOLUTION\n"
        "    else:\n        return 2\n",
        3,
        "not valid Python",
    ),
    "only_yield": (
        f"def f():\n    x = 1\n    {TODO}\n    # BEGIN SOLUTION\n    yield x\n    # END SOLUTION\n",
        4,
        "generator",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_markers_are_one_error_naming_file_and_line(case):
    text, line, phrase = BAD[case]
    with pytest.raises(MarkerError) as info:
        practice.strip_file(text, "fusion/lesson.py", 4)
    assert str(info.value).startswith(f"fusion/lesson.py:{line}: "), str(info.value)
    assert phrase in str(info.value)


def test_region_outside_a_phase_module_is_an_error():
    text = f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n"
    with pytest.raises(MarkerError, match=r"^fusion/common.py:3: .*lesson file"):
        practice.strip_file(text, "fusion/common.py", None)
    assert practice.strip_file("def f():\n    return 1\n", "fusion/common.py", None)[1] == []


def test_generator_keeping_a_yield_outside_the_region_is_fine():
    text = f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n    yield x\n"
    assert len(practice.strip_file(text, "fusion/lesson.py", 4)[1]) == 1


def test_phase_of():
    modules = {p.module: p.number for p in PHASES}
    assert practice.phase_of("fusion/trace_basics.py", modules) == 1
    # regions live only in the lesson files: a machinery subpackage is plumbing, even one named like a lesson
    assert practice.phase_of("fusion/regions/costs.py", modules) is None
    assert practice.phase_of("fusion/kernels/cublaslt.py", modules) is None
    assert practice.phase_of("fusion/common.py", modules) is None
    assert practice.phase_of("tests/test_trace_basics.py", modules) is None


# ----------------------------------------------------------------------------------------------------------------------
# "needs Phase N": a test stopped by another phase's TODO is skipped, by tests/conftest.py


def test_todo_phases():
    assert practice.todo_phases(NotImplementedError("TODO(human) Phase 2: x. Hint: y")) == {2}
    assert practice.todo_phases(NotImplementedError("not yet")) is None
    assert practice.todo_phases(RuntimeError("TODO(human) Phase 2: x")) is None
    todo3 = NotImplementedError("TODO(human) Phase 3: x")
    assert practice.todo_phases(ExceptionGroup("g", [todo3, NotImplementedError("TODO(human) Phase 5: y")])) == {3, 5}
    assert practice.todo_phases(ExceptionGroup("g", [todo3, ValueError("real bug")])) is None


def test_conftest_skips_tests_stopped_by_another_phases_todo(pytester):
    conftest = Path(__file__).with_name("conftest.py").read_text(encoding="utf-8")
    pytester.makeconftest(conftest)
    pytester.makeini("[pytest]\nmarkers =\n    phase1: p1\n    phase2: p2\n    tooling: t\n")
    pytester.makepyfile(
        test_x="""
        import pytest
        from hypothesis import given, strategies as st

        def todo(n):
            raise NotImplementedError(f"TODO(human) Phase {n}: the task. Hint: uv run python -m fusion.practice hint {n}")

        @pytest.mark.phase2
        def test_needs_phase1():
            todo(1)

        @pytest.mark.phase2
        @given(st.integers(1, 3))
        def test_needs_phase1_hypothesis(n):
            todo(1)

        @pytest.fixture
        def needs1():
            todo(1)

        @pytest.mark.phase2
        def test_fixture_needs_phase1(needs1):
            pass

        @pytest.mark.phase2
        def test_own_todo_fails():
            todo(2)

        @pytest.mark.phase2
        def test_real_bug_fails():
            raise NotImplementedError("something else")

        @pytest.mark.tooling
        def test_tooling_todo_fails():
            todo(1)

        @pytest.mark.phase2
        def test_cli_printed_phase1_todo():  # a lesson's CLI catches the TODO, prints it and returns 1
            import sys
            print("\\nTODO(human) Phase 1: the task. Hint: uv run python -m fusion.practice hint 1", file=sys.stderr)
            assert 1 == 0

        @pytest.mark.phase2
        def test_cli_printed_own_todo_fails():
            print("TODO(human) Phase 2: the task. Hint: uv run python -m fusion.practice hint 2")
            assert 1 == 0

        @pytest.fixture(scope="module")
        def cli_run():
            print("TODO(human) Phase 1: the task. Hint: uv run python -m fusion.practice hint 1")
            assert 1 == 0

        @pytest.mark.phase2
        def test_module_fixture_needs_phase1(cli_run):
            pass

        @pytest.mark.phase2
        def test_module_fixture_needs_phase1_again(cli_run):  # the cached error comes back without its output
            pass

        @pytest.mark.phase2
        def test_assert_message_shows_phase1_todo():  # e.g. an assert that shows a CLI's captured stderr
            assert 1 == 0, "the lesson failed:\\nTODO(human) Phase 1: the task. Hint: uv run python -m fusion.practice hint 1"

        CALLS = []

        @pytest.mark.phase2
        @given(st.integers(0, 1000), st.lists(st.integers()))
        def test_own_todo_hypothesis_fails_at_first_example(n, xs):
            CALLS.append(n)
            todo(2)

        @pytest.mark.phase2
        def test_zz_hypothesis_did_not_shrink_the_todo():
            assert len(CALLS) == 1, CALLS

        @pytest.mark.phase2
        @given(st.integers(0, 1000))
        def test_real_bug_hypothesis_still_shrinks(n):
            assert n < 10

        @pytest.mark.phase2
        def test_passes():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rfs")
    result.assert_outcomes(passed=2, failed=6, skipped=7)
    result.stdout.fnmatch_lines(
        ["*needs Phase 1: solve its TODO(human) first (uv run python -m fusion.practice hint 1)"]
    )
    for name in ("test_own_todo_fails", "test_real_bug_fails", "test_tooling_todo_fails", "test_cli_printed_own_todo"):
        result.stdout.fnmatch_lines([f"FAILED test_x.py::{name}*"])
    result.stdout.fnmatch_lines(
        [
            "*_ test_own_todo_hypothesis_fails_at_first_example _*",
            "NotImplementedError: TODO(human) Phase 2: the task. Hint: *",
            "(hypothesis stopped at the first example*",
        ]
    )
    if not practice.is_workspace():  # in a workspace nothing shrinks (tested below); in the reference it still does
        result.stdout.fnmatch_lines(["*assert 10 < 10"])  # any other failure is shrunk to its minimal example
    assert "practice.py" not in result.stdout.str()  # the wrapper hides its own frame from tracebacks


def test_in_a_workspace_hypothesis_reports_the_first_failing_example_without_shrinking(pytester, monkeypatch):
    """A wrong solution in a workspace fails at once with the example that broke it: no shrinking (which made a
    phase's tests take minutes instead of seconds). In the reference, failures are still shrunk."""
    from hypothesis import settings

    conftest = Path(__file__).with_name("conftest.py").read_text(encoding="utf-8")
    pytester.makeconftest(conftest)
    pytester.makeini("[pytest]\nmarkers =\n    phase1: p1\n")
    pytester.makepyfile(
        test_w="""
        import pytest
        from hypothesis import given, settings, strategies as st

        CALLS = []

        @pytest.mark.phase1
        @settings(database=None)  # no failing example saved by an earlier run: the reference must find and shrink one
        @given(st.integers(0, 10**6), st.lists(st.integers(0, 100), max_size=20))
        def test_wrong_solution(n, xs):
            CALLS.append(n)
            assert n < 1000

        @pytest.mark.phase1
        def test_zz_calls_after_the_first_failure():
            first = next(i for i, n in enumerate(CALLS) if n >= 1000)
            print("CALLS", len(CALLS) - first - 1)
        """
    )
    outer = settings.get_current_profile_name()
    try:
        results = {}
        for workspace in (False, True):  # the reference first: the second run keeps the first one's profile
            monkeypatch.setattr(practice, "is_workspace", lambda root=None, _w=workspace: _w)
            result = pytester.runpytest("-p", "no:cacheprovider", "-s")
            result.assert_outcomes(passed=1, failed=1)
            results[workspace] = int(re.search(r"CALLS (\d+)", result.stdout.str()).group(1))
    finally:
        settings.load_profile(outer)
    assert results[True] <= 1, results  # at most the final replay of the failing example
    assert results[False] > 1, results  # the reference shrinks


def test_verdict_says_all_done_only_when_every_phase_of_a_workspace_passes(tmp_path):
    everything = list(range(1, 10))

    def todos(open_phases):
        return [practice.Todo(n, f"fusion/p{n}.py", 10, "t", "h", n in open_phases) for n in everything]

    # `check 5` with 4 and 6 unsolved: not "All done"
    done, text = practice.verdict({5: "✓"}, everything, todos({4, 6}), True, tmp_path)
    assert not done and "All done" not in text
    assert "Phase 5 passes" in text and "still to do: 4, 6" in text
    assert "Not tested this run: phase 1, 2, 3, 7, 8, 9" in text
    # every phase solved, but only phase 9 tested: still not "All done"
    done, text = practice.verdict({9: "✓"}, everything, todos(set()), True, tmp_path)
    assert not done and "All done" not in text and "Phase 9 passes" in text
    # every phase tested, one waiting for another: not done
    statuses = {n: "✓" for n in everything} | {4: "… needs Phase 5"}
    done, text = practice.verdict(statuses, everything, todos(set()), True, tmp_path)
    assert not done and "still to do: 4" in text
    done, text = practice.verdict({n: "✓" for n in everything}, everything, todos(set()), True, tmp_path)
    assert done and text.startswith("All done")
    # the reference checkout: never "All done", and it says what it checked
    done, text = practice.verdict({1: "✓"}, everything, todos(set()), False, tmp_path)
    assert not done and "All done" not in text
    assert "not a practice workspace" in text and "phase 1" in text and "practice start" in text


def test_next_todo_is_the_one_the_lesson_stops_at():
    todos = [
        practice.Todo(2, "fusion/manual_fusion.py", 212, "a", "", True),
        practice.Todo(2, "fusion/manual_fusion.py", 368, "b", "", True),
        practice.Todo(3, "fusion/pattern_rewriter.py", 100, "c", "", True),
    ]
    assert practice.next_todo(todos).line == 212  # without a run: file order
    assert practice.next_todo(todos, ("fusion/manual_fusion.py", 368)).line == 368  # where the lesson stopped
    # a lesson that stops at a later phase's TODO: that is where the learner is stopped, so that is Next
    assert practice.next_todo(todos, ("fusion/pattern_rewriter.py", 100)).line == 100
    assert practice.next_todo(todos, ("fusion/common.py", 5)).line == 212  # not a TODO: file order
    assert practice.next_todo([t for t in todos if t.phase == 3]).phase == 3


def _fake_check(monkeypatch, tmp_path, capsys, wrong: set[int], stubbed: set[int]) -> tuple[str, dict]:
    """``check`` of a made-up workspace, its test run faked: each phase of ``wrong`` has every TODO filled in and one
    failing test (a wrong solution), each of ``stubbed`` has its stub left (a test fails on it); the rest pass."""
    from fusion.practice import progress

    todos = [practice.Todo(p.number, f"fusion/{p.module}.py", 10, "task", "h", p.number in stubbed) for p in PHASES]
    tally = practice._Tally()
    for p in PHASES:
        t = tally.tally[p.number] = practice.PhaseTally(passed=3)
        failures = [("test_wrong", "AssertionError: maximum(nan, 0) gave 0", None)] if p.number in wrong else []
        if p.number in stubbed:
            failures.append(("test_stub", f"NotImplementedError: TODO(human) Phase {p.number}: task", p.number))
        for name, message, todo_phase in failures:
            t.failed += 1
            nodeid = f"tests/test_{p.module}.py::{name}"
            t.failures.append({"nodeid": nodeid, "when": "call", "message": message, "todo_phase": todo_phase})
    monkeypatch.setattr(progress, "scan_todos", lambda root: todos)
    monkeypatch.setattr(progress, "is_workspace", lambda root: True)
    monkeypatch.setattr(progress, "run_tests", lambda *args, **kwargs: (tally, 1))
    monkeypatch.setattr(progress, "lesson_stop", lambda module: None)  # as if the lesson stopped at no TODO
    assert practice.check(root=tmp_path, json_path=str(tmp_path / "check.json")) == 1
    return capsys.readouterr().out, json.loads((tmp_path / "check.json").read_text())


def test_next_is_the_first_unsolved_phase_even_with_its_todos_filled_in(monkeypatch, tmp_path, capsys):
    # Phase 8 filled in but wrong, Phase 9 not started: Next is Phase 8 (its failing test), not Phase 9's TODO
    out, result = _fake_check(monkeypatch, tmp_path, capsys, wrong={8}, stubbed={9})
    assert "still to do: 8, 9" in out
    assert "Next: Phase 8" in out and "Next: Phase 9" not in out
    assert "tests/test_codegen.py::test_wrong" in out and "maximum(nan, 0) gave 0" in out
    assert "pytest -m phase8" in out and "fusion/codegen.py:10" in out  # the test to run, the code to look at
    assert result["next_phase"] == 8 and result["next"] is None
    # a stubbed phase before a wrong one: Next is the stubbed phase's TODO, as before
    out, result = _fake_check(monkeypatch, tmp_path, capsys, wrong={8}, stubbed={3, 9})
    assert "Next: Phase 3, fusion/pattern_rewriter.py:10" in out
    assert result["next_phase"] == 3 and result["next"]["phase"] == 3
    # every phase before the stub passes: Next is that TODO
    out, result = _fake_check(monkeypatch, tmp_path, capsys, wrong=set(), stubbed={9})
    assert "Next: Phase 9, fusion/backend.py:10" in out and result["next"]["phase"] == 9
    # no stub left, two wrong phases: the first of them
    out, result = _fake_check(monkeypatch, tmp_path, capsys, wrong={6, 7}, stubbed=set())
    assert "Next: Phase 6" in out and "tests/test_regions.py::test_wrong" in out and result["next_phase"] == 6


@pytest.mark.parametrize("first_failure", [False, True])
def test_check_tally_per_phase(pytester, first_failure):
    pytester.makeini("[pytest]\nmarkers =\n    phase1: p1\n    phase2: p2\n")
    pytester.makepyfile(
        test_y="""
        import pytest

        @pytest.mark.phase1
        def test_a(): pass

        @pytest.mark.phase1
        def test_b(): raise NotImplementedError("TODO(human) Phase 1: b. Hint: h")

        @pytest.mark.phase1
        def test_c(): assert False, "real"

        @pytest.mark.phase1
        def test_d(): pass

        @pytest.mark.phase2
        def test_e(): pytest.skip("needs Phase 1: solve it")

        def test_untagged(): pass
        """
    )
    tally = practice._Tally(first_failure)
    pytester.inline_run("-p", "no:cacheprovider", plugins=[tally])
    one, two = tally.tally[1], tally.tally[2]
    assert (one.passed, one.failed, one.not_run) == ((1, 1, 2) if first_failure else (2, 2, 0))
    assert one.failures[0]["todo_phase"] == 1 and one.failures[0]["message"].startswith("NotImplementedError: TODO")
    if not first_failure:
        assert one.failures[1] == {
            "nodeid": "test_y.py::test_c",
            "when": "call",
            "message": "AssertionError: real",
            "todo_phase": None,
        }
    assert (two.passed, two.failed, two.blocked) == (0, 0, {1: 1})
    assert practice.phase_status(1, one, 1).startswith("✗")
    assert practice.phase_status(2, two, 0) == "… needs Phase 1"


# check N runs exactly `pytest -m phaseN`: a small project whose phase 1 spans two files (as tests/test_models.py and
# tests/test_trace_basics.py do) and whose tests/test_fuzz.py mixes phases per function; a test outside testpaths.
# Its addopts ask for xdist's workers, as the project's do: check still tallies every test in its own process.
SELECTION_PROJECT = {
    "pyproject.toml": (
        "[tool.pytest.ini_options]\ntestpaths = ['tests']\naddopts = '--strict-markers -n 2 --dist loadfile'\n"
        "markers = [\n" + "".join(f"    'phase{n}: p',\n" for n in (1, 8, 9)) + "]\n"
    ),
    "tests/test_trace_basics.py": "import pytest\npytestmark = pytest.mark.phase1\ndef test_a(): pass\ndef test_b(): pass\n",
    "tests/test_models.py": "import pytest\npytestmark = pytest.mark.phase1\ndef test_model(): pass\n",
    "tests/test_codegen.py": "import pytest\npytestmark = pytest.mark.phase8\ndef test_kernel(): pass\n",
    "tests/test_fuzz.py": (
        "import pytest\n@pytest.mark.phase8\ndef test_gen(): pass\n"
        "@pytest.mark.phase9\n@pytest.mark.parametrize('x', [1, 2])\ndef test_backend(x): pass\n"
    ),
    "tests/test_backend.py": "import pytest\npytestmark = pytest.mark.phase9\ndef test_compile(): pass\n",
    "test_outside.py": "import pytest\n@pytest.mark.phase1\ndef test_elsewhere(): pass\n",
}

# One process for the three phases, phase by phase: `pytest -m phaseN --collect-only` (pytest.main takes the command
# line's arguments) and check's own selection (progress.run_tests).
SELECTED_BY_CHECK = """
import json, os, sys
from pathlib import Path
import pytest
from fusion.practice.progress import run_tests
class Ids:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]
found = {}
for phase in sys.argv[1:]:
    ids = Ids()
    assert pytest.main(["-m", f"phase{phase}", "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[ids]) == 0
    tally, code = run_tests(Path.cwd(), [int(phase)])
    found[phase] = {"collected": ids.ids, "selected": tally.selected}
print(json.dumps({"found": found, "profile": os.environ.get("HYPOTHESIS_PROFILE")}))
"""


def test_check_n_runs_exactly_the_tests_of_pytest_m_phase_n(tmp_path):
    """`practice check N` and `uv run pytest -m phaseN` select the same tests (every file of testpaths, not one file
    per phase) and check leaves the hypothesis profile to tests/conftest.py, as `uv run pytest` does."""
    for rel, text in SELECTION_PROJECT.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    env.update(PYTHONPATH=str(REF), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-c", SELECTED_BY_CHECK, "1", "8", "9"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["profile"] is None
    for phase, want in {1: 3, 8: 2, 9: 3}.items():  # phase 1: both files; phase 8: test_fuzz's phase-8 test only
        found = result["found"][str(phase)]
        assert set(found["selected"]) == {str(phase)}, (phase, found["selected"])
        assert set(found["selected"][str(phase)]) == set(found["collected"]), phase
        assert len(found["collected"]) == want, (phase, found["collected"])


# ----------------------------------------------------------------------------------------------------------------------
# start: a tiny synthetic reference (not a git checkout: the walk path)


def fake_reference(root: Path) -> Path:
    files = {
        "pyproject.toml": "[project]\nname = 'x'\n",
        "uv.lock": "lock\n",
        "README.md": "# x\n",
        "notes.txt": "not part of a workspace\n",
        "fusion/__init__.py": "",
        "fusion/lesson.py": NESTED,
        "fusion/helpers.py": "def helper():\n    return 1\n",
        "tests/test_lesson.py": "def test_x():\n    s = '# BEGIN SOLUTION'\n",
        "scripts/run.sh": "#!/bin/sh\necho hi\n",
        ".venv/lib/site.py": "x = 1\n",
        "fusion/__pycache__/lesson.cpython-311.pyc": "junk",
        "tests/.hypothesis/db": "junk",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "scripts/run.sh").chmod(0o755)
    return root


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_start_writes_a_workspace_and_leaves_the_reference_alone(tmp_path):
    ref = fake_reference(tmp_path / "ref")
    before = tree_digest(ref)
    dest = tmp_path / "ws"
    dest.mkdir()  # an existing empty directory is fine
    plan = practice.start(dest, root=ref, modules={"lesson": 3})
    assert tree_digest(ref) == before
    assert sorted(tree_digest(dest)) == [
        ".practice.json",
        "README.md",
        "fusion/__init__.py",
        "fusion/helpers.py",
        "fusion/lesson.py",
        "pyproject.toml",
        "scripts/run.sh",
        "tests/test_lesson.py",
        "uv.lock",
    ]
    assert (dest / "scripts/run.sh").stat().st_mode & 0o111  # executable bits kept
    assert len(plan.regions) == 2
    lesson = (dest / "fusion/lesson.py").read_text(encoding="utf-8")
    assert lesson.count("raise NotImplementedError(") == 2
    assert (dest / "tests/test_lesson.py").read_text() == (ref / "tests/test_lesson.py").read_text()
    assert "Practice workspace" in (dest / "README.md").read_text() and (dest / "README.md").read_text().endswith(
        "# x\n"
    )
    info = json.loads((dest / ".practice.json").read_text())
    assert info["reference"] == str(ref.resolve())
    lines = lesson.splitlines()
    for r in info["regions"]:  # the recorded line is the TODO line, right above its stub, in the workspace
        assert lines[r["line"] - 1].strip().startswith("# TODO(human):")
        assert practice.STUB_RE.match(lines[r["line"]]) and r["phase"] == 3

    todos = practice.scan_todos(dest, {"lesson": 3})
    assert [(t.line, t.open) for t in todos] == [(12, True), (18, True)]
    assert todos[0].hint == "x * 2, then out.append"
    assert [t.open for t in practice.scan_todos(ref, {"lesson": 3})] == [False, False]

    with pytest.raises(PracticeError, match="practice workspace"):  # start from a workspace: refused
        practice.start(tmp_path / "ws2", root=dest, modules={"lesson": 3})


def test_the_task_list_comes_from_the_reference_not_from_the_learners_comments(tmp_path):
    ref = fake_reference(tmp_path / "ref")
    practice.start(tmp_path / "ws", root=ref, modules={"lesson": 3})
    lesson = tmp_path / "ws/fusion/lesson.py"
    lines = lesson.read_text().splitlines(keepends=True)
    todo_lines = [i for i, line in enumerate(lines) if line.strip().startswith("# TODO(human):")]
    del lines[todo_lines[1]]  # the learner deletes the second TODO comment, keeps the stub
    del lines[todo_lines[0] : todo_lines[0] + 2]  # ... and solves the first by deleting comment and stub
    lesson.write_text("".join(lines))
    todos = practice.scan_todos(tmp_path / "ws", {"lesson": 3})
    assert [(t.task, t.open) for t in todos] == [
        ("double every x that is not None", False),
        ("return a plus one", True),
    ]
    assert [t.hint for t in todos] == ["x * 2, then out.append", "the + operator"]
    assert lines[todos[1].line - 1].lstrip().startswith("raise NotImplementedError")  # points at the stub now


def test_hint_has_two_levels_and_never_the_solution(tmp_path, capsys):
    ref = fake_reference(tmp_path / "ref")
    lesson = ref / "fusion/lesson.py"
    lesson.write_text(
        lesson.read_text().replace("Hint: x * 2, then out.append", "Hint: x * 2. More: out.append(y) in the loop")
    )
    practice.start(tmp_path / "ws", root=ref, modules={"lesson": 3})
    shown = (tmp_path / "ws/fusion/lesson.py").read_text()  # the task and the first hint; the second is asked for
    assert "# TODO(human): double every x that is not None. Hint: x * 2\n" in shown
    assert "# TODO(human): return a plus one. Hint: the + operator\n" in shown
    assert "out.append(y) in the loop" not in shown
    assert practice.hint(3, root=tmp_path / "ws") == 0
    one = capsys.readouterr().out
    assert "hint: x * 2\n" in one and "out.append(y) in the loop" not in one and "--more" in one
    assert practice.hint(3, root=tmp_path / "ws", more=True) == 0
    two = capsys.readouterr().out
    assert "more: out.append(y) in the loop" in two
    assert "hint: the + operator" in two and "more: (no second level" in two  # a one-level TODO line still works
    for solution_line in ("y = x * 2", "+ 1"):
        assert solution_line not in one + two


def test_start_with_a_solved_phase_keeps_its_reference_code(tmp_path):
    ref = fake_reference(tmp_path / "ref")
    plan = practice.start(tmp_path / "ws", root=ref, modules={"lesson": 3, "helpers": 4}, solved=[3])
    assert plan.regions == [] and len(plan.solved) == 2
    lesson = (tmp_path / "ws/fusion/lesson.py").read_text()
    markerless = [line for line in NESTED.splitlines() if line.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION")]
    assert lesson.splitlines()[4:] == markerless[2:]  # the docstring's quoted markers stay, they are text
    assert "# TODO(human): double every x" in lesson and "y = x * 2" in lesson
    assert json.loads((tmp_path / "ws/.practice.json").read_text())["solved_phases"] == [3]
    assert [t.open for t in practice.scan_todos(tmp_path / "ws", {"lesson": 3})] == [False, False]
    with pytest.raises(PracticeError, match="no phase"):
        practice.start(tmp_path / "ws2", root=ref, modules={"lesson": 3}, solved=[9])


def test_solve_copies_the_reference_regions_in(tmp_path):
    """What CI's round trip does to solve a phase: the workspace file becomes the reference minus its markers."""
    ref = fake_reference(tmp_path / "ref")
    practice.start(tmp_path / "ws", root=ref, modules={"lesson": 3, "helpers": 4})
    assert practice.solve(tmp_path / "ws", [4], ref, {"lesson": 3, "helpers": 4}) == 0  # no region in phase 4
    assert practice.solve(tmp_path / "ws", [3], ref, {"lesson": 3, "helpers": 4}) == 2
    markers = ("# BEGIN SOLUTION", "# END SOLUTION")
    body = [line for line in NESTED.splitlines() if line.strip() not in markers]
    assert (tmp_path / "ws/fusion/lesson.py").read_text().splitlines()[4:] == body[2:]  # docstring: quoted markers
    assert [t.open for t in practice.scan_todos(tmp_path / "ws", {"lesson": 3})] == [False, False]


def test_start_refuses_a_non_empty_dir_and_a_dir_inside_the_reference(tmp_path):
    ref = fake_reference(tmp_path / "ref")
    dest = tmp_path / "ws"
    dest.mkdir()
    (dest / "mine.py").write_text("keep me\n")
    with pytest.raises(PracticeError, match="not an empty directory"):
        practice.start(dest, root=ref, modules={"lesson": 3})
    assert [p.name for p in dest.iterdir()] == ["mine.py"]
    with pytest.raises(PracticeError, match="inside the reference"):
        practice.start(ref / "ws", root=ref, modules={"lesson": 3})
    assert not (ref / "ws").exists()


def test_start_writes_nothing_when_a_marker_is_wrong(tmp_path):
    ref = fake_reference(tmp_path / "ref")
    (ref / "fusion/helpers.py").write_text(f"def f():\n    {TODO}\n    # BEGIN SOLUTION\n    return 1\n")
    with pytest.raises(MarkerError, match=r"^fusion/helpers.py:3: unclosed"):
        practice.start(tmp_path / "ws", root=ref, modules={"lesson": 3, "helpers": 4})
    assert not (tmp_path / "ws").exists()


def test_cli_start_error_is_one_line(tmp_path, capsys):
    (tmp_path / "x").write_text("occupied")
    assert practice.main(["start", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("practice start: error:") and "not an empty directory" in err and "\n" not in err


# ----------------------------------------------------------------------------------------------------------------------
# The round trip over the real reference: every region stubbed, the workspace runs, every phase fails on its own TODO

REF = practice.package_root()
needs_reference = pytest.mark.skipif(
    practice.is_workspace(REF), reason="practice workspace: the round trip runs in the reference checkout"
)


def _run(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(PYTHONPATH=str(cwd), PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="ci")
    return subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory):
    """Generate a workspace from this reference, then run in it, in parallel, with this interpreter: an import of
    every module, the first phase's lesson, fusion.main --quick and the tooling tests.

    The full `practice check` of the all-stubbed workspace (every test of every phase: each phase fails only on its
    own TODO, check N selects `pytest -m phaseN --collect-only`'s tests, its table and Next) is CI's next step,
    `python -m fusion.practice.roundtrip` (stubbed_problems), which checks it before solving the first phase."""
    ws = tmp_path_factory.mktemp("practice") / "ws"
    before = reference_contents()
    plan = practice.start(ws, root=REF)
    after = reference_contents()
    first = min(PHASES, key=lambda p: p.number)
    probe = (
        "import importlib, pkgutil, fusion\n"
        "mods = [m.name for m in pkgutil.walk_packages(fusion.__path__, 'fusion.')]\n"
        "[importlib.import_module(m) for m in mods]\n"
        "print(fusion.__file__); print(','.join(mods))"
    )
    procs = {
        "probe": _run(["-c", probe], ws),
        "lesson": _run(["-m", f"fusion.{first.module}"], ws),
        "main": _run(["-m", "fusion.main", "--quick"], ws),
        # -n 0: the same tests in one process (two xdist workers would only collect the whole suite twice more), from
        # the files that name the marker: -m selects the same tests, without importing every other test module
        "tooling": _run(
            ["-m", "pytest", "-m", "tooling", "-q", "-p", "no:cacheprovider", "-x", "-n", "0", *tooling_files(ws)], ws
        ),
        "refcheck": _run(["-m", "fusion.practice", "check", str(first.number), "-x"], REF),
    }
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        done[name] = (proc.returncode, out, err)
    return {"ws": ws, "plan": plan, "runs": done, "before": before, "after": after, "first": first}


def tooling_files(root: Path) -> list[str]:
    return [Path(f).relative_to(root).as_posix() for f in marker_test_files(root, ["tooling"])]


def reference_contents() -> dict[str, bytes]:
    return {rel: (REF / rel).read_bytes() for rel in practice.project_files(REF)}


@needs_reference
def test_no_hint_level_gives_a_solution_line_away():
    """`hint N --more` prints the TODO line's two levels: neither may hold a line of the reference solution (any line
    of 12 characters or more: the second level names the idea and the API, it does not dictate the code)."""
    plan = practice.scan_reference(REF)
    leaks = []
    for r in plan.regions:
        lines = (REF / r.path).read_text(encoding="utf-8").splitlines()[r.begin : r.end - 1]
        for line in (line.split("  #")[0].strip() for line in lines):
            if len(line) >= 12 and (line in r.hint or line in r.more):
                leaks.append(f"{r.path}:{r.todo_line}: {line!r}")
    assert not leaks, leaks


@needs_reference
@pytest.mark.parametrize("phase", [1, 3])
def test_phase_todo_lines_have_two_hint_levels(phase):
    regions = [r for r in practice.scan_reference(REF).regions if r.phase == phase]
    assert regions and all(r.hint and r.more for r in regions), [(r.todo_line, r.hint, r.more) for r in regions]


@needs_reference
def test_roundtrip_every_phase_has_regions(roundtrip):
    phases = {r.phase for r in roundtrip["plan"].regions}
    missing = [p.number for p in PHASES if p.number not in phases]
    assert not missing, f"phases without a TODO(human) region: {missing}"


@needs_reference
def test_roundtrip_every_region_became_a_stub_and_no_marker_is_left(roundtrip):
    ws, plan = roundtrip["ws"], roundtrip["plan"]
    by_file: dict[str, list] = {}
    for r in plan.regions:
        by_file.setdefault(r.path, []).append(r)
    for rel, regions in by_file.items():
        ref_lines = roundtrip["before"][rel].decode("utf-8").splitlines()  # the reference as start() read it
        lines = (ws / rel).read_text(encoding="utf-8").splitlines()
        stubs = [i for i, line in enumerate(lines, 1) if practice.STUB_RE.match(line)]
        assert len(stubs) == len(regions), rel
        for r, s in zip(sorted(regions, key=lambda r: r.begin), stubs, strict=True):
            assert lines[s - 1] == r.stub  # same indentation as the markers, phase from fusion.main.PHASES
            assert lines[s - 1][: len(r.indent)] == ref_lines[r.begin - 1][: len(r.indent)] == r.indent
            assert lines[s - 2] == r.todo  # the TODO(human) line stays: its task and first hint, not the second
            assert r.hint in lines[s - 2] and (not r.more or r.more not in lines[s - 2])
    for path in sorted(ws.rglob("*.py")):
        rel = path.relative_to(ws).as_posix()
        with path.open("rb") as f:
            toks = [t for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT]
        left = [t.start[0] for t in toks if re.match(r"#\s*(BEGIN|END)\s+SOLUTION", t.string, re.I)]
        assert not left, f"markers left in {rel} at lines {left}"
    modules = {p.module: p.number for p in PHASES}
    phase_files = [p for p in ws.rglob("*.py") if practice.phase_of(p.relative_to(ws).as_posix(), modules)]
    stubs = sum(bool(practice.STUB_RE.match(line)) for p in phase_files for line in p.read_text().splitlines())
    assert stubs == len(plan.regions)
    assert not (ws / ".venv").exists() and not (ws / ".git").exists() and not list(ws.rglob("__pycache__"))


@needs_reference
def test_roundtrip_reference_is_untouched(roundtrip):
    # compared right before and right after start(): others may edit this checkout while the tests run
    assert roundtrip["after"] == roundtrip["before"]
    modules = {p.module: p.number for p in PHASES}
    for rel, data in roundtrip["after"].items():
        if practice.phase_of(rel, modules):
            assert not any(practice.STUB_RE.match(line) for line in data.decode("utf-8").splitlines()), rel


@needs_reference
def test_roundtrip_workspace_imports_its_own_fusion_cleanly(roundtrip):
    code, out, err = roundtrip["runs"]["probe"]
    assert code == 0, err
    fusion_file, mods = out.strip().splitlines()[-2:]
    assert Path(fusion_file).resolve() == (roundtrip["ws"] / "fusion" / "__init__.py").resolve()
    assert {f"fusion.{p.module}" for p in PHASES} <= set(mods.split(","))


@needs_reference
def test_roundtrip_lesson_stops_at_a_todo_of_its_phase(roundtrip):
    """The lesson prints the TODO and where it is, without a traceback. That it is the TODO `check` calls Next (one
    pointer) is checked by CI's round trip step (fusion.practice.roundtrip), after check's full run."""
    code, out, err = roundtrip["runs"]["lesson"]
    first = roundtrip["first"]
    assert code == 1, err[-3000:]
    assert "Traceback" not in err
    assert re.search(rf"^TODO\(human\) Phase {first.number}: .*\. Hint: {re.escape(HINT)} {first.number}$", err, re.M)
    sites = {f"  at {t.path}:{t.line}" for t in practice.scan_todos(roundtrip["ws"]) if t.phase == first.number}
    assert sites & set(err.splitlines()), (sorted(sites), err[-3000:])


def _fake_stubbed_run(monkeypatch, check: dict, collected: dict, out: str):
    """fusion.practice.roundtrip's subprocesses replaced: `check --json` writes ``check``, collect prints ``collected``."""
    from fusion.practice import roundtrip as rt

    class Done:
        def __init__(self, args):
            self.args, self.returncode = args, 0
            if "--json" in args:
                Path(args[args.index("--json") + 1]).write_text(json.dumps(check))
                self.returncode = 1

        def communicate(self, timeout=None):
            return (out, "") if "--json" in self.args else (json.dumps(collected), "")

    monkeypatch.setattr(rt, "_popen", lambda args, cwd: Done(args))
    return rt


def test_the_round_trip_step_checks_the_all_stubbed_workspace(tmp_path, monkeypatch):
    """CI's round trip step (fusion.practice.roundtrip.stubbed_problems) holds the all-stubbed workspace's full check
    that this file's fixture ran before: fed a check result that breaks an invariant, it names each broken one."""
    (tmp_path / "fusion").mkdir()
    (tmp_path / "fusion/__init__.py").write_text("")
    (tmp_path / "fusion/a.py").write_text("def f():\n    # TODO(human): do a. Hint: h\n    raise NotImplementedError\n")
    todo = "TODO(human) Phase 1: do a. Hint: uv run python -m fusion.practice hint 1"
    ids = {str(p.number): [f"tests/t.py::test_{p.number}"] for p in PHASES}
    tally = {"passed": 0, "skipped": 0, "not_run": 0, "blocked": {}}
    good = {
        "fusion_file": str(tmp_path / "fusion/__init__.py"),
        "collection_errors": [],
        "phases": {
            "1": {
                **tally,
                "failed": 1,
                "failures": [{"nodeid": ids["1"][0], "when": "call", "message": todo, "todo_phase": 1}],
            },
            "2": {**tally, "failed": 0, "blocked": {"1": 1}, "failures": []},
        },
        "selected": ids,
        "status": {"1": "✗", "2": "… needs Phase 1"},
        "all_done": False,
        "next": {"phase": 1, "path": "fusion/a.py", "line": 2},
    }
    out = "phase  TODOs done  tests passed\n...\nNext: Phase 1, fusion/a.py:2\n  stuck?  uv run python -m fusion.practice hint 1"
    rt = _fake_stubbed_run(monkeypatch, good, ids, out)
    tasks = {"fusion/a.py:2": "do a"}
    assert rt.stubbed_problems(tmp_path, [1], tasks, log=lambda *a: None) == ([], good)

    bad = json.loads(json.dumps(good))
    bad["phases"]["1"]["failures"][0]["message"] = "AssertionError: wrong"  # a failure that is not its TODO
    bad["phases"]["2"]["blocked"] = {"3": 1}  # waits for a phase without regions
    bad["selected"]["2"] = []  # check 2 != pytest -m phase2
    bad["all_done"] = True
    rt = _fake_stubbed_run(monkeypatch, bad, ids, out.replace("Next", "Later"))
    problems, _ = rt.stubbed_problems(tmp_path, [1, 2], tasks, log=lambda *a: None)
    text = "\n".join(problems)
    for expected in [
        "fails with 'AssertionError: wrong'",
        "Phase 2: no test fails",
        "check 2 != pytest -m phase2",
        "All done",
        "does not print Next",
    ]:
        assert expected in text, text


@needs_reference
def test_check_in_the_reference_says_it_is_not_a_workspace(roundtrip):
    code, out, err = roundtrip["runs"]["refcheck"]
    assert code == 0, (out + err)[-3000:]
    assert "All done" not in out
    assert "not a practice workspace" in out and "phase 1" in out  # and what it checked


@needs_reference
def test_roundtrip_main_shows_unsolved_phases_as_todo(roundtrip):
    code, out, err = roundtrip["runs"]["main"]
    assert code == 0, (out + err)[-3000:]
    assert "Traceback" not in err, err[-3000:]
    summary = out[out.rindex("Summary") :]
    with_regions = {r.phase for r in roundtrip["plan"].regions}
    for p in PHASES:
        row = next(line for line in summary.splitlines() if re.match(rf"\s*{p.number}\s+{p.module}\s", line))
        assert ("TODO" if p.number in with_regions else "ok") in row.split(), row


@needs_reference
def test_roundtrip_tooling_tests_pass_in_the_workspace(roundtrip, request):
    code, out, err = roundtrip["runs"]["tooling"]
    assert code == 0, (out + err)[-3000:]
    assert "skipped" in out  # the round trip itself skips there
    # the files it ran hold every tooling test this session collected (all of them when it collected tests/)
    files = {Path(i.path).name for i in request.session.items if i.get_closest_marker("tooling")}
    assert files <= {Path(f).name for f in tooling_files(roundtrip["ws"])}, files


# ----------------------------------------------------------------------------------------------------------------------
# Opt-in (FUSION_PRACTICE_SOLO=1, about as long as the whole suite): each phase solved ALONE, every other phase
# stubbed. Its tests must pass or skip "needs Phase N": none may fail because another phase is unsolved.


@needs_reference
@pytest.mark.skipif(not os.environ.get("FUSION_PRACTICE_SOLO"), reason="opt-in: FUSION_PRACTICE_SOLO=1")
@pytest.mark.parametrize("phase", [p.number for p in PHASES])
def test_each_phase_solved_alone_passes_or_waits(phase, tmp_path):
    ws = tmp_path / "ws"
    practice.start(ws, root=REF, solved=[phase])
    proc = _run(["-m", "fusion.practice", "check", str(phase), "--json", str(ws / "check.json")], ws)
    out, err = proc.communicate(timeout=900)
    result = json.loads((ws / "check.json").read_text())
    t = result["phases"][str(phase)]
    assert result["collection_errors"] == [] and t["failed"] == 0, (t["failures"], out[-2000:])
    assert result["status"][str(phase)] == "✓" or result["status"][str(phase)].startswith("… needs")


@pytest.mark.parametrize(
    "argv", [["start", "somewhere", "--solved", "one"], ["check", "two"], ["check", ""], ["hint", "x"], []]
)
def test_cli_bad_arguments_are_usage_errors_not_tracebacks(argv, capsys):
    with pytest.raises(SystemExit) as info:
        practice.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m fusion.practice") and "Traceback" not in err


def test_cli_unknown_phase_is_one_line(capsys):
    assert practice.main(["hint", "99"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("practice hint: error: no phase 99") and "\n" not in err
