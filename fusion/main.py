"""Run every phase of the course in order: ``uv run python -m fusion.main [--quick] [--only 1,3] [--list]``.

Each phase prints its lesson under a heading; a summary table (phase, status, seconds) closes the run. A phase that
fails prints its error and the others still run; the exit status is non-zero if any phase failed. In a practice
workspace a phase whose exercise is not solved yet shows as ``TODO`` (not as a crash, and not as a failure).
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from fusion.common import heading, is_todo, plain, table, todo_message


@dataclass(frozen=True)
class Phase:
    number: int
    module: str  # fusion.<module> has run(quick=False)
    title: str


# The curriculum, in order. Adding a phase is one line here.
PHASES: tuple[Phase, ...] = (
    Phase(1, "trace_basics", "trace basics: symbolic_trace, the six opcodes, ShapeProp"),
    Phase(2, "manual_fusion", "a hand-written pass: Linear+ReLU -> FusedLinearReLU"),
    Phase(3, "pattern_rewriter", "subgraph_rewriter: matmul+add+relu -> one fused call"),
    Phase(4, "benchmark", "fused vs unfused vs torch.compile, explained by the roofline"),
    Phase(5, "conv_bn_fusion", "fold BatchNorm into Conv/Linear weights"),
    Phase(6, "regions", "fusion regions on the aten graph, costed by bytes / bandwidth"),
    Phase(7, "horizontal_fusion", "horizontal fusion: sibling Linears/Convs that read one input become one wide op"),
    Phase(8, "codegen", "code generation: every fusion region becomes one generated Triton kernel"),
    Phase(9, "backend", 'your compiler: torch.compile(model, backend="fusion")'),
    Phase(10, "overlap", "overlap scheduling: compute hides the collectives of distributed training"),
)


def _parse_only(text: str, phases: Sequence[Phase]) -> list[Phase]:
    """``--only 1,3`` → those phases, in course order. Raises ValueError (argparse shows it as a usage error)."""
    known = [p.number for p in phases]
    try:
        wanted = {int(p) for p in text.split(",") if p.strip()}
    except ValueError:
        raise ValueError(f"{text!r} is not a list of phase numbers; the phases are {known}, e.g. --only 1,3") from None
    if not wanted:
        raise ValueError(f"no phase given; the phases are {known}, e.g. --only 1,3 (leave --only out to run all)")
    unknown = wanted - set(known)
    if unknown:
        raise ValueError(f"no phase {sorted(unknown)}; the phases are {known}")
    return [p for p in phases if p.number in wanted]


def run_phases(phases: Sequence[Phase], quick: bool = False) -> list[tuple[Phase, str, float]]:
    """Run each phase; return (phase, status, seconds) with status 'ok', 'TODO' or 'FAILED'."""
    results = []
    for phase in phases:
        heading(f"Phase {phase.number}: {phase.title}   (python -m fusion.{phase.module})", "#")
        start = time.perf_counter()
        try:
            importlib.import_module(f"fusion.{phase.module}").run(quick=quick)
            status = "ok"
        except NotImplementedError as e:
            if not is_todo(e):
                traceback.print_exc()
                status = "FAILED"
            else:
                print(f"\n{todo_message(e)}")
                status = "TODO"
        except Exception:
            traceback.print_exc()
            status = "FAILED"
        results.append((phase, status, time.perf_counter() - start))
    return results


def main(argv: Sequence[str] | None = None, phases: Sequence[Phase] = PHASES) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusion.main", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--quick", action="store_true", help="each phase's fast mode (what CI runs)")
    parser.add_argument("--only", metavar="N[,N]", help="run only these phases, e.g. --only 1,3")
    parser.add_argument("--list", action="store_true", help="list the phases and exit")
    args = parser.parse_args(argv)

    if args.list:
        print(table([(p.number, f"python -m fusion.{p.module}", p.title) for p in phases], ["phase", "run", "what"]))
        return 0
    selected = list(phases)
    if args.only is not None:
        try:
            selected = _parse_only(args.only, phases)
        except ValueError as e:
            parser.error(f"--only: {e}")
    results = run_phases(selected, quick=args.quick)

    heading("Summary")
    print(table([(p.number, p.module, s, f"{t:.1f}") for p, s, t in results], ["phase", "module", "status", "seconds"]))
    failed = [p.number for p, s, _ in results if s == "FAILED"]
    if failed:
        print(f"\nFailed: phase {', '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
