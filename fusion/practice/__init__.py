"""Learner mode: turn the reference into an exercise workspace, then check progress and give hints.

Run it:
    uv run python -m fusion.practice start ../fusion-practice   # write the exercise workspace (an empty DIR)
    cd ../fusion-practice
    uv run python -m fusion.practice check         # ✓/✗ per phase, tests passing, the next TODO(human)
    uv run python -m fusion.practice check 2 -x    # only Phase 2's tests, stop at its first failure
    uv run python -m fusion.practice hint 2        # Phase 2's tasks and first hints, file:line of each
    uv run python -m fusion.practice hint 2 --more # ... and the second level: the idea, the API to read about
    uv run python -m fusion.practice start DIR --solved 1,2,3   # begin at Phase 4 (reference code kept)
    uv run python -m fusion.practice lint          # (authors) validate the markers, list every region
Test it:  uv run pytest -m tooling tests/test_practice.py

The idea (nbgrader's BEGIN/END SOLUTION, minitorch's per-task markers, rustlings' progress and hints)
---------------------------------------------------------------------------------------------------
The reference solutions in the phase modules are marked as *learner regions*::

        # TODO(human): fuse each Linear whose only user is a ReLU. Hint: node.users. More: replace_all_uses_with
        # BEGIN SOLUTION
        ...reference code...
        # END SOLUTION

``start`` copies the project (pyproject.toml, uv.lock, README.md, fusion/, tests/, scripts/; never .venv, .git or
caches) and replaces every region, at the same indentation, by one statement, under the task and its first hint::

        # TODO(human): fuse each Linear whose only user is a ReLU. Hint: node.users
        raise NotImplementedError("TODO(human) Phase 2: fuse each Linear whose only user is a ReLU. Hint: uv run python -m fusion.practice hint 2")

Hints are levels: the file shows the task (which states every rule the tests check) and the first hint (what to look
at); ``hint N --more`` gives the second (the idea, the API to read about; never the code), asked for. The reference
keeps the whole line.

The phase number comes from the file: ``fusion.main.PHASES`` maps phase N to the lesson file ``fusion/<module>.py``.
Regions live only in lesson files; machinery subpackages (``fusion/kernels/``, ``fusion/bench/``, this package) are
plumbing, copied unchanged. Markers are read as Python *comments* (``tokenize``), so a marker quoted inside a
string or docstring is text, not a marker. Every problem is one error naming the file and line: a region outside a
phase module or outside a function body, nested/unclosed/orphaned markers, a BEGIN without its TODO(human) line
right above, markers at different indentation, an empty region, a region holding its function's only ``yield``.
Each stubbed file is parsed (``ast``) before anything is written, and the reference tree is only ever read.

In the workspace an unsolved region raises ``NotImplementedError("TODO(human) Phase N: ...")``:
``python -m fusion.<phase>`` and ``fusion.main`` turn it into a message (``fusion.common.lesson_cli``), and
``tests/conftest.py`` turns a test of phase M that stops at phase N's TODO (N != M) into a skip "needs Phase N",
so ``pytest`` fails exactly in the tests of the unsolved phases; and a hypothesis test that hits a stub stops at its
first example instead of shrinking (a stub fails on every input; shrinking it cost minutes per phase). In a workspace hypothesis does not shrink: a wrong solution fails with its first failing example, at once.
The workspace root carries ``.practice.json`` (where it came from, and every region's phase, file, task and hints,
from the reference: deleting a ``# TODO(human)`` comment loses nothing); its presence is how the tooling knows it
runs in a workspace. ``check`` says "All done" only when every phase of a workspace passes. ``check N`` runs exactly
the tests of ``uv run pytest -m phaseN`` (the whole tests/ directory, the same hypothesis profile): a phase's tests
have one definition, its marker, and every test carries exactly one (tests/test_layout.py checks).

The package: ``markers`` (read and strip regions), ``workspace`` (the tree, ``start``, the TODOs), ``hooks`` (pytest
in a workspace), ``progress`` (``check``), ``cli`` (the command line), ``roundtrip`` (CI: solve every phase in turn).
"""

from fusion.practice.cli import hint, lint, main
from fusion.practice.hooks import (
    _exc_message,
    _todo_stop,
    adjust_report,
    blocked_by,
    failure_todos,
    item_phase,
    practice_profile,
    printed_todos,
    stop_hypothesis_at_todo,
    todo_phases,
)
from fusion.practice.markers import (
    BEGIN,
    END,
    STUB_RE,
    TODO_PREFIX,
    WORKSPACE_FILE,
    Comment,
    MarkerError,
    PracticeError,
    Region,
    comments,
    find_regions,
    split_todo,
    strip_file,
    strip_text,
    stub_line,
)
from fusion.practice.progress import (
    PhaseTally,
    _Tally,
    check,
    find_next,
    first_unsolved,
    lesson_stop,
    next_todo,
    phase_status,
    pytest_args,
    run_tests,
    verdict,
)
from fusion.practice.workspace import (
    Todo,
    Workspace,
    is_workspace,
    lesson_texts,
    package_root,
    phase_modules,
    phase_of,
    project_files,
    scan_reference,
    scan_todos,
    solve,
    start,
    workspace_info,
)

__all__ = [
    "BEGIN",
    "Comment",
    "END",
    "MarkerError",
    "PhaseTally",
    "PracticeError",
    "Region",
    "STUB_RE",
    "TODO_PREFIX",
    "Todo",
    "WORKSPACE_FILE",
    "Workspace",
    "_Tally",
    "_exc_message",
    "_todo_stop",
    "adjust_report",
    "blocked_by",
    "check",
    "comments",
    "failure_todos",
    "find_next",
    "find_regions",
    "first_unsolved",
    "hint",
    "is_workspace",
    "lesson_texts",
    "item_phase",
    "lesson_stop",
    "lint",
    "main",
    "next_todo",
    "package_root",
    "phase_modules",
    "phase_of",
    "phase_status",
    "practice_profile",
    "printed_todos",
    "pytest_args",
    "project_files",
    "run_tests",
    "scan_reference",
    "scan_todos",
    "solve",
    "split_todo",
    "start",
    "stop_hypothesis_at_todo",
    "strip_file",
    "strip_text",
    "stub_line",
    "todo_phases",
    "verdict",
    "workspace_info",
]
