"""CI's practice round trip: a fresh workspace, each phase solved in turn by copying the reference region in.

Run it:  uv run python -m fusion.practice.roundtrip [--sample K] [--keep DIR]

After every step ``practice check`` (in a subprocess, importing the workspace's own ``fusion``) must report exactly
the solved phases: the phase just solved passes (or waits for a later, unsolved one), every unsolved phase is still
to do, and "All done" appears only at the very end. The lesson of the next phase must stop at the TODO(human) that
``check`` calls "Next". At the end the workspace's ``fusion/`` is byte for byte the reference's, so the reference's
full test run (``uv run pytest``) is the full test run of the solved workspace; here each check runs the first
``--sample`` tests of each phase (the tally and the verdicts are what is under test), which keeps CI fast.
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


def _python(args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(PYTHONPATH=str(cwd), PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="ci")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


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
