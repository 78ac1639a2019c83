"""fusion.main: phase selection, summary, and a failing phase not stopping the others."""

import types

import pytest

from fusion import main as runner

pytestmark = pytest.mark.tooling


@pytest.fixture
def fake_phases(monkeypatch):
    calls = []

    def make(name, behaviour):
        def run(quick=False):
            calls.append((name, quick))
            behaviour()

        mod = types.ModuleType(f"fusion.{name}")
        mod.run = run
        monkeypatch.setitem(__import__("sys").modules, f"fusion.{name}", mod)

    def ok():
        print("phase ran")

    def boom():
        raise RuntimeError("injected failure")

    def todo():
        raise NotImplementedError("TODO(human) Phase 3: write it")

    make("fake_ok", ok)
    make("fake_boom", boom)
    make("fake_todo", todo)
    phases = (
        runner.Phase(1, "fake_ok", "ok"),
        runner.Phase(2, "fake_boom", "boom"),
        runner.Phase(3, "fake_todo", "todo"),
        runner.Phase(4, "fake_ok", "ok again"),
    )
    return phases, calls


def test_failing_phase_makes_exit_nonzero_and_others_still_run(fake_phases, capsys):
    phases, calls = fake_phases
    assert runner.main([], phases=phases) == 1
    assert [c[0] for c in calls] == ["fake_ok", "fake_boom", "fake_todo", "fake_ok"]
    out, err = capsys.readouterr()
    assert "injected failure" in err
    summary = out[out.index("Summary") :]
    assert "FAILED" in summary and "TODO" in summary and "ok" in summary


def test_only_selects_and_quick_is_passed(fake_phases):
    phases, calls = fake_phases
    assert runner.main(["--only", "1,4", "--quick"], phases=phases) == 0
    assert calls == [("fake_ok", True), ("fake_ok", True)]


def test_todo_alone_is_not_a_failure(fake_phases):
    phases, calls = fake_phases
    assert runner.main(["--only", "3"], phases=phases) == 0


@pytest.mark.parametrize("only", ["9", "two", "", " , ", "1,x"])
def test_bad_only_is_a_usage_error_not_a_traceback_and_runs_nothing(fake_phases, capsys, only):
    phases, calls = fake_phases
    with pytest.raises(SystemExit) as info:
        runner.main(["--only", only], phases=phases)
    assert info.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m fusion.main") and "--only" in err and "Traceback" not in err
    assert calls == []  # '' used to run every phase


def test_help_names_the_command_and_has_no_rest_markup(capsys):
    with pytest.raises(SystemExit):
        runner.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m fusion.main") and "main.py" not in out
    assert "`" not in out  # reStructuredText backticks are for the docstring, not the terminal


@pytest.mark.parametrize("module", ["fusion.trace_basics", "fusion.pattern_rewriter", "fusion.practice"])
def test_lesson_and_practice_help_name_the_command(module):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.startswith(f"usage: python -m {module}") and "`" not in out


def test_list(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    for p in runner.PHASES:
        assert f"fusion.{p.module}" in out


def test_every_registered_phase_is_importable_and_runnable():
    import importlib

    for p in runner.PHASES:
        assert callable(importlib.import_module(f"fusion.{p.module}").run)
