"""CI's practice round trip: a fresh workspace, each phase solved in turn by copying the reference region in.

Run it:  uv run python -m fusion.practice.roundtrip [--sample K] [--keep DIR]

After every step ``practice check`` (in a subprocess, importing the workspace's own ``fusion``) must report exactly
the solved phases: the phase just solved passes (or waits for a later, unsolved one), every unsolved phase is still
to do, and "All done" appears only at the very end. The lesson of the next phase must stop at the TODO(human) that
``check`` calls "Next". At the end the workspace's ``fusion/`` is byte for byte the reference's, so the reference's
full test run (``uv run pytest``) is the full test run of the solved workspace; here each check runs the first
``--sample`` tests of each phase (the tally and the verdicts are what is under test), which keeps CI fast.

Before the first phase is solved, the all-stubbed workspace is checked in full (every test of every phase, no
sample): each phase fails only on its own TODO(human) (a test waiting for another phase skips "needs Phase N"),
check's tests of phase N are exactly ``pytest -m phaseN --collect-only``'s, it imports the workspace's own
``fusion``, and it prints its table and a Next that the lesson agrees with. (That full run is this step's, not the
test suite's: tests/test_practice.py's round trip checks the rest of the fresh workspace.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from fusion.practice.workspace import lesson_texts, package_root, phase_modules, solve, start


def _popen(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(PYTHONPATH=str(cwd), PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="ci")
    return subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _python(args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = _popen(args, cwd)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_check(ws: Path, phases: Sequence[int], sample: int | None) -> tuple[dict, str]:
    out = ws / ".roundtrip-check.json"
    out.unlink(missing_ok=True)
    args = ["-m", "fusion.practice", "check", *map(str, phases), "-x", "--json", str(out)]
    proc = _python(args + ([f"--sample={sample}"] if sample else []), ws)
    if not out.exists():
        raise AssertionError(f"check {phases} wrote no JSON:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text(encoding="utf-8")), proc.stdout


def lesson_stop(ws: Path, module: str) -> str | None:
    """'path:line' that ``python -m fusion.<module> --quick`` prints when a TODO stops it (None if it runs through)."""
    proc = _python(["-m", f"fusion.{module}", "--quick"], ws)
    m = re.search(r"^  at (\S+:\d+)$", proc.stderr, re.MULTILINE)
    return m.group(1) if m else None


# `pytest -m phaseN --collect-only` for every phase, in one process (the test modules are imported once)
COLLECT_EACH_PHASE = """
import json, pytest
from fusion.main import PHASES
class Ids:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]
found = {}
for p in PHASES:
    ids = Ids()
    pytest.main(["-m", f"phase{p.number}", "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[ids])
    found[str(p.number)] = ids.ids
print(json.dumps(found))
"""


def stubbed_problems(ws: Path, with_regions: Sequence[int], tasks: dict[str, int], log=print) -> tuple[list, dict]:
    """Check the all-stubbed workspace in full (``practice check --json``, every test of every phase) beside
    ``pytest -m phaseN --collect-only`` for every phase; return (the problems found, check's JSON result)."""
    from fusion.main import PHASES

    out_json = ws / ".roundtrip-stubbed.json"
    procs = {
        "check": _popen(["-m", "fusion.practice", "check", "--json", str(out_json)], ws),
        "collect": _popen(["-c", COLLECT_EACH_PHASE], ws),
    }
    runs = {name: (*proc.communicate(timeout=1800), proc.returncode) for name, proc in procs.items()}
    (out, err, code), (c_out, c_err, c_code) = runs["check"], runs["collect"]
    if not out_json.exists():
        return [f"all stubbed: check wrote no JSON:\n{out[-3000:]}\n{err[-3000:]}"], {}
    check = json.loads(out_json.read_text(encoding="utf-8"))
    problems: list[str] = []
    # check imports the workspace's own fusion and collects every test file
    if Path(check["fusion_file"]).resolve() != (ws / "fusion" / "__init__.py").resolve():
        problems.append(f"check imported {check['fusion_file']}, not the workspace's fusion")
    if check["collection_errors"]:
        problems.append(f"collection errors: {check['collection_errors']}")
    # each phase fails only on its own TODO: a test that needs another phase waits for it ("needs Phase N")
    for p in PHASES:
        t = check["phases"].get(str(p.number))
        if p.number not in with_regions:
            continue
        if t is None or t["failed"] == 0:
            counts = t and {k: t[k] for k in ("passed", "blocked")}
            problems.append(f"Phase {p.number}: no test fails on its stubs ({counts})")
            continue
        for f in t["failures"]:
            # the stub's NotImplementedError, or its message printed by a lesson's CLI that the test called
            if f["todo_phase"] != p.number or f"TODO(human) Phase {p.number}: " not in f["message"]:
                problems.append(f"Phase {p.number}: {f['nodeid']} ({f['when']}) fails with {f['message']!r}")
        if not set(map(int, t["blocked"])) <= set(with_regions) - {p.number}:
            problems.append(f"Phase {p.number}: blocked by {t['blocked']}")
        if not check["status"][str(p.number)].startswith("✗"):
            problems.append(f"Phase {p.number}: check says {check['status'][str(p.number)]!r}")
    # A region no test reaches while every region is stubbed may be reached once the regions before it (in the same
    # function, or in one that calls it) are solved: reported, not a failure.
    reached = {f["message"] for t in check["phases"].values() for f in t["failures"]}
    unreached = [where for where, task in tasks.items() if not any(f": {task}. Hint:" in m for m in reached)]
    if unreached:
        log(f"  (warning) no test reached these regions in the all-stubbed workspace: {unreached}")
    # check N runs exactly the tests of `pytest -m phaseN`, for every N; no test without a phase runs
    if c_code != 0:
        problems.append(f"pytest --collect-only failed in the workspace: {c_err[-3000:]}")
    else:
        collected = json.loads(c_out.strip().splitlines()[-1])
        for p in PHASES:
            mine, theirs = set(check["selected"].get(str(p.number), [])), set(collected[str(p.number)])
            if mine != theirs:
                problems.append(f"check {p.number} != pytest -m phase{p.number}: {sorted(mine ^ theirs)[:5]}")
    if not set(check["selected"]) <= {str(p.number) for p in PHASES}:
        problems.append(f"check ran tests without a phase: {sorted(check['selected'])}")
    # the table, no "All done", and Next: the first TODO of the lowest phase, with its hint command
    if code != 1 or "TODOs done" not in out or "tests passed" not in out:
        problems.append(f"check's exit status {code} or its table is wrong:\n{out[-2000:]}{err[-2000:]}")
    if "All done" in out or check["all_done"]:
        problems.append("check says 'All done' with every phase stubbed")
    nxt = check["next"]
    if nxt is None or nxt["phase"] != min(with_regions):
        problems.append(f"check's Next is {nxt}, expected a TODO of Phase {min(with_regions)}")
    else:
        line = (ws / nxt["path"]).read_text(encoding="utf-8").splitlines()[nxt["line"] - 1]
        if f"Next: Phase {nxt['phase']}, {nxt['path']}:{nxt['line']}" not in out or f"hint {nxt['phase']}" not in out:
            problems.append(f"check does not print Next and its hint command:\n{out[-2000:]}")
        if not line.strip().startswith("# TODO(human):"):
            problems.append(f"check's Next {nxt['path']}:{nxt['line']} is not a TODO(human) line: {line!r}")
    return problems, check


def roundtrip(dest: Path, sample: int | None = 4, log=print) -> list[str]:
    """Run the round trip in ``dest`` (an empty or new directory); return the problems found (empty: it passed)."""
    reference = package_root()
    modules = phase_modules()
    module_of = {n: m for m, n in modules.items()}
    everything = sorted(modules.values())
    texts = lesson_texts(reference, modules)  # the reference as start() reads it (others may edit it meanwhile)
    plan = start(dest, root=reference)
    with_regions = sorted({r.phase for r in plan.regions})
    log(f"workspace {dest}: {len(plan.regions)} regions in phases {with_regions}")
    problems: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)
            log(f"  ✗ {what}")

    def check_next(result: dict, step: str) -> None:
        nxt = result["next"]
        if nxt is None:
            return
        lowest = min(t["phase"] for t in result["todos"] if t["open"])  # the lesson check names with Next
        stop = lesson_stop(dest, module_of[lowest])
        where = f"{nxt['path']}:{nxt['line']}"
        expect(stop == where, f"{step}: check's Next is {where}, the lesson stops at {stop}")

    t0 = time.perf_counter()
    tasks = {f"{r.path}:{r.todo_line}": r.task for r in plan.regions}
    found, stubbed = stubbed_problems(dest, with_regions, tasks, log)
    for what in found:
        expect(False, f"all stubbed: {what}")
    if stubbed.get("next"):
        check_next(stubbed, "all stubbed")
    log(f"all stubbed: {stubbed.get('verdict', '-')}   ({time.perf_counter() - t0:.0f} s, every test)")

    solved: list[int] = []
    for phase in everything:
        t0 = time.perf_counter()
        replaced = solve(dest, [phase], reference, modules, texts)
        solved.append(phase)
        unsolved = [n for n in with_regions if n not in solved]
        last = phase == everything[-1]
        result, out = run_check(dest, everything if last else [phase], sample)
        status = result["status"].get(str(phase), "")
        waits = [int(n) for n in re.findall(r"Phase (\d+)", status)] if status.startswith("…") else []
        step = f"Phase {phase} solved ({replaced} regions)"
        expect(
            status == "✓" or (waits and set(waits) <= set(unsolved)),
            f"{step}: check says {status!r} for it ({result['phases'].get(str(phase))})",
        )
        if last:
            bad = {n: s for n, s in result["status"].items() if s != "✓"}
            expect(not bad and result["all_done"], f"{step}, every phase solved: not all done: {bad}")
            expect("All done" in out, f"{step}, every phase solved: check does not say 'All done'")
        else:
            expect(not result["all_done"] and "All done" not in out, f"{step}: check says 'All done' too early")
            if status == "✓":
                expect(f"Phase {phase} passes" in result["verdict"], f"{step}: verdict {result['verdict']!r}")
            if unsolved:
                todo = f"still to do: {', '.join(map(str, sorted(set(unsolved) | set(waits))))}"
                expect(todo in result["verdict"], f"{step}: verdict {result['verdict']!r}, expected {todo!r}")
            open_phases = sorted({t["phase"] for t in result["todos"] if t["open"]})
            expect(open_phases == unsolved, f"{step}: open TODOs in phases {open_phases}, expected {unsolved}")
            check_next(result, step)
        log(f"phase {phase}: {status or '-'}   {result['verdict']}   ({time.perf_counter() - t0:.0f} s)")

    differ = [rel for rel, text in texts.items() if _code(text) != _code((dest / rel).read_text(encoding="utf-8"))]
    expect(not differ, f"solved lesson files differ from the reference (apart from the markers): {differ}")
    return problems


def _code(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() not in _MARKERS]


_MARKERS = ("# BEGIN SOLUTION", "# END SOLUTION")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fusion.practice.roundtrip",
        description="CI: a fresh practice workspace, each phase solved in turn; check must report exactly that.",
    )
    parser.add_argument("--sample", type=int, default=4, help="tests per phase in each check (0: all; default 4)")
    parser.add_argument("--keep", metavar="DIR", help="write the workspace here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fusion-roundtrip-") as tmp:
        dest = Path(args.keep) if args.keep else Path(tmp) / "ws"
        problems = roundtrip(dest, args.sample or None)
    print(f"\nround trip: {'FAILED' if problems else 'ok'} in {time.perf_counter() - t0:.0f} s")
    for p in problems:
        print(f"  ✗ {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
