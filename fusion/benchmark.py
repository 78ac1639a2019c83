"""Phase 4 — an honest benchmark: fused vs unfused vs torch.compile, explained by the roofline.

Run it:   uv run python -m fusion.benchmark [--device cpu|cuda] [--quick] [--no-compile] [--json PATH] [--plot PATH]
          uv run --extra plot python -m fusion.benchmark --plot roofline.png     (the picture needs matplotlib)
          uv run python -m fusion.benchmark --suite [--models resnet18,bert] [--backends eager,fusion] [--json PATH]
          uv run python -m fusion.benchmark --suite --device cpu --sizes cpu [--threads N]   (the CPU suite)
Test it:  uv run pytest -m phase4

What you learn
--------------
* How to time code so the number means something. Warm up first (caches, lazy initialisation, cuDNN's autotuning,
  clocks ramping up). On CUDA, wait for the GPU before reading the clock: kernels run *asynchronously*, so without
  ``torch.cuda.synchronize()`` you time how fast Python queues work, not the work. Time *blocks* of calls, many of
  them, and report the **median** block: one lucky or unlucky block (a neighbour, an interrupt) moves the mean and
  the minimum, not the median. Time the variants of one workload *interleaved* (A B C A B C ...) in one process so
  that a slow phase of the machine hits them all alike and their ratio stays fair.
* How to measure memory: the peak bytes a call allocates above what was already resident. CUDA's caching allocator
  keeps that statistic (``reset_peak_memory_stats``, ``max_memory_allocated``); on CPU we log every allocation and
  free the dispatcher sees and take the maximum of their running sum. Fusion's saving shows here too: an
  intermediate tensor that is never written is never allocated.
* The roofline model. A kernel needs at least ``FLOPs / peak FLOP/s`` seconds (compute) and at least
  ``bytes / peak bytes/s`` seconds (memory); it cannot beat the larger of the two. ``FLOPs / bytes`` is the
  *arithmetic intensity*: below the machine's ridge point (peak FLOP/s ÷ peak bytes/s) a kernel is memory-bound.
  Whether a workload is memory- or compute-bound is a property of the workload *and the machine*: a batch-64
  Linear is memory-bound on an H100 (ridge ~240 FLOP/byte) and compute-bound on a laptop CPU (ridge ~2-6). So the
  benchmark never names the bound up front: it measures this machine's peaks and lets the roofline say.
* Why fusion pays where it pays. Fusion removes *intermediate tensors*: bytes written by one kernel only to be read
  back by the next. It removes no FLOPs. So a memory-bound chain speeds up by about the bytes it saves, and a
  compute-bound matmul barely moves. Where the model does not hold, the report says why: caches (a working set that
  fits in L2 runs above the DRAM roofline), per-call launch and Python overhead at small sizes (on CUDA the profiler
  splits each call into GPU kernel time and the rest), and library kernels that reach their ceilings unequally.

The idea
--------
Every workload runs as several variants, interleaved: eager (unfused), the course's passes (Phases 2, 3, 5, 7),
Phase 8's generated kernels and Phase 9's backend where they exist, and ``torch.compile`` beside them. The peaks of
*this* machine are measured at start-up (a large copy, a large matmul) with your timing loop. From the FX graph and
ShapeProp's shapes we count each node's FLOPs and bytes (``fusion/bench/counting.py``), so your roofline *predicts*
the speedup of fusion before we measure it; the tables put both side by side.

You write the three measurements the whole benchmark stands on — the timing loop, the peak memory and the roofline
bound — below. The harness that builds the workloads, profiles the GPU and prints the tables lives in
``fusion/bench/`` (plumbing, no exercise): ``workloads.py`` (what is measured), ``config.py`` (sizes per device),
``counting.py`` (FLOPs and bytes per node), ``profile.py`` (peaks, GPU profiler, CPU allocation log), ``harness.py``
(the run), ``rows.py`` (one row's numbers), ``report.py`` (tables, verdicts, targets) and ``plot.py`` (the roofline
picture).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils import benchmark as tbench

from fusion.bench.config import default_config
from fusion.bench.counting import NodeCost
from fusion.bench.counting import kernels_bound as per_node_bound
from fusion.bench.harness import SCHEMA_VERSION, Lesson, benchmark  # noqa: F401 (the JSON's schema version)
from fusion.bench.plot import PLOT_HINT, have_matplotlib, plot_roofline
from fusion.bench.profile import AllocationLog, Peaks
from fusion.bench.report import check_targets, print_report
from fusion.common import run_lesson

# ----------------------------------------------------------------------------------------------------------------------
# 1. The timing loop


@dataclass(frozen=True)
class Timing:
    median_s: float  # the median of times_s: the number every table prints
    times_s: tuple[float, ...]  # seconds per call, one entry per timed block, every round together


def _no_sync() -> None:
    pass


def time_variants(
    fns: dict[str, Callable[[], object]],
    *,
    rounds: int,
    min_run_time: float,
    warmup: int = 3,
    sync: Callable[[], None] = _no_sync,
    clock: Callable[[], float] = timeit.default_timer,
    threads: int = 1,
) -> dict[str, Timing]:
    """Time every function of ``fns``, interleaved round by round (A B C A B C ...); return each one's Timing.

    ``sync()`` waits for the device (``torch.cuda.synchronize`` on CUDA; nothing on CPU) and ``clock()`` reads the
    time: read time only through them. Each round gives every function at least one block of about
    ``min_run_time`` seconds; a block's entry in ``times_s`` is its time divided by the calls it made.

    >>> t = time_variants({"noop": lambda: None}, rounds=2, min_run_time=1e-3)
    >>> len(t["noop"].times_s) >= 2 and t["noop"].median_s > 0
    True
    """
    # TODO(human): warm each fn up, then time them round by round in blocks (sync before every clock read) and return each one's median block; tests check the warm-up calls, the device wait, the A B C order and the median. Hint: blocks from torch.utils.benchmark.Timer.blocked_autorange, or from your own loop; a clock that syncs before it reads. More: torch.utils.benchmark.Timer takes a timer= function (one that syncs, then reads clock(), makes every block honest), the fn through its globals, and num_threads; blocked_autorange(min_run_time=...) returns a Measurement whose .times holds one time per block; statistics.median gives the median of a name's blocks over all rounds
    # BEGIN SOLUTION
    for fn in fns.values():  # warm-up: caches, lazy initialisation, autotuning, clocks ramping up
        for _ in range(warmup):
            fn()
    sync()

    def synced_clock() -> float:
        sync()  # kernels run asynchronously: wait for them, or you time how fast Python queues work
        return clock()

    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):  # interleaved: a slow phase of the machine hits every variant alike
        for name, fn in fns.items():
            timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, timer=synced_clock, num_threads=threads)
            times[name].extend(timer.blocked_autorange(min_run_time=min_run_time).times)
    return {name: Timing(statistics.median(ts), tuple(ts)) for name, ts in times.items()}
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# 2. Peak memory


def peak_memory(fn: Callable[[], object], device: str) -> int:
    """Peak bytes allocated during one call of ``fn``, above what was allocated before it.

    On CUDA, ask the caching allocator: reset its peak statistic, remember what is allocated now, call, wait for the
    GPU, read the peak. On CPU torch keeps no such statistic, so log the call (``AllocationLog``: ``+nbytes`` per
    allocation, ``-nbytes`` per free) and find the largest running total.

    >>> x = torch.randn(256, 256)
    >>> peak_memory(lambda: torch.relu(x * 2), "cpu") == 2 * x.nbytes   # x*2 and its relu, alive at once
    True
    """
    # TODO(human): return the peak bytes one call allocates above what was resident: on CUDA from the allocator's statistics (tests check: reset before the call, synchronize after it, what was allocated before subtracted), on CPU from an AllocationLog of the call (tests check the largest live total on known ops). Hint: the peak is a maximum since a reset, taken after the GPU finished, minus the bytes allocated before the call. More: CUDA: torch.cuda's memory statistics (reset_peak_memory_stats, memory_allocated, max_memory_allocated) and torch.cuda.synchronize, in the order the task states; CPU: an AllocationLog's events are signed byte counts, so the peak is the largest running sum (itertools.accumulate)
    # BEGIN SOLUTION
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()  # the peak is only known once the kernels ran
        peak = torch.cuda.max_memory_allocated() - before
        del out
        return int(peak)
    with AllocationLog() as log:
        out = fn()
    del out
    live = peak = 0
    for delta in log.events:  # +bytes when an op allocates a tensor, -bytes when it dies
        live += delta
        peak = max(peak, live)
    return peak
    # END SOLUTION


# ----------------------------------------------------------------------------------------------------------------------
# 3. The roofline bound


@dataclass(frozen=True)
class Roofline:
    flops: int
    nbytes: int
    intensity: float  # FLOPs per byte
    bound_s: float  # the roofline's lower bound on the time
    bound_by: str  # "memory" or "compute": the ceiling that binds


def roofline(flops: float, nbytes: float, peaks: Peaks) -> Roofline:
    """The roofline bound of computing ``flops`` and moving ``nbytes`` on a machine with these ``peaks``.

    >>> r = roofline(flops=2e9, nbytes=1e8, peaks=Peaks(flops_per_s=1e12, bytes_per_s=1e11))
    >>> r.intensity, r.bound_by
    (20.0, 'compute')
    """
    # TODO(human): return the Roofline of this work: its intensity, the time no kernel can beat, and which ceiling binds; tests check the bound on hand-made and random cases, and that bound_by agrees with intensity vs the ridge. Hint: the machine needs time for the FLOPs and time for the bytes, and cannot overlap them better than perfectly. More: one time per ceiling, each the amount of work over the machine's peak rate for it (peaks.flops_per_s, peaks.bytes_per_s); the bound is the time no overlap can hide; bound_by names that ceiling; the intensity is FLOPs per byte (float('inf') when no byte moves)
    # BEGIN SOLUTION
    compute_s = flops / peaks.flops_per_s
    memory_s = nbytes / peaks.bytes_per_s
    intensity = flops / nbytes if nbytes else float("inf")
    bound_by = "compute" if compute_s >= memory_s else "memory"
    return Roofline(int(flops), int(nbytes), intensity, max(compute_s, memory_s), bound_by)
    # END SOLUTION


def kernels_bound(costs: Sequence[NodeCost], peaks: Peaks) -> float:
    """What your roofline predicts for a graph run as one kernel per node: each pays its own bytes, times add up.
    Fusion's predicted speedup is this bound for eager's graph divided by the same for the fused graph."""
    return per_node_bound(costs, lambda f, b: roofline(f, b, peaks).bound_s, peaks.bytes_per_s)


LESSON = Lesson(
    roofline=lambda flops, nbytes, peaks: roofline(flops, nbytes, peaks),  # looked up at call time: tests patch them
    time_variants=lambda fns, **kw: time_variants(fns, **kw),
    peak_memory=lambda fn, device: peak_memory(fn, device),
)


# ----------------------------------------------------------------------------------------------------------------------
# Entry points


def register_lessons() -> None:
    """Import the lessons whose passes this benchmark measures: importing one registers its functions with
    ``fusion/compiler/registry.py`` (Phases 2, 3, 5, 7, 8, 9). Done when a run needs them, not when this module is
    imported: Dynamo, Triton and the backend cost ~4 s of every process that imports them (each suite model runs in
    a process of its own)."""
    from fusion import backend, codegen, conv_bn_fusion, horizontal_fusion, manual_fusion, pattern_rewriter  # noqa: F401


def run(
    quick: bool = False,
    *,
    device: str | None = None,
    compile: bool = True,
    json_path: str | None = None,
    plot_path: str | None = None,
    sizes: str | None = None,
    threads: int = 0,
    only: Sequence[str] = (),
    budget_s: float = 0.0,
) -> dict:
    """The lesson: measure the peaks, run every workload, print the tables (and save JSON / the picture)."""
    register_lessons()
    config = default_config(device, quick=quick, compile=compile)
    config = dataclasses.replace(
        config, sizes=sizes or config.sizes, threads=threads or config.threads, only=tuple(only), budget_s=budget_s
    )
    if not config.compile:
        print(f"(torch.compile skipped: {'--quick' if quick else '--no-compile'})")
    elif config.device == "cpu":
        print("(torch.compile on CPU: Inductor writes and compiles C++ for each workload — tens of seconds each)")

    def log(msg: str) -> None:
        print(msg, flush=True)

    result = benchmark(config, LESSON, log=log, json_path=json_path, check_targets=check_targets)
    print_report(result)
    if json_path:
        print(f"\nraw numbers: {json_path}")
    if plot_path:
        plot_roofline(result, plot_path)
        print(f"roofline picture: {plot_path}")
    if result["errors"]:
        failed = ", ".join(e["workload"] for e in result["errors"])
        raise RuntimeError(f"{len(result['errors'])} workload(s) failed: {failed} (tracebacks above and in the JSON)")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    first = (__doc__ or "").strip().splitlines()[0]
    p = argparse.ArgumentParser(prog="python -m fusion.benchmark", description=first)
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    p.add_argument("--quick", action="store_true", help="smaller CPU sizes, fewer rounds, no torch.compile (CI)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    p.add_argument("--json", metavar="PATH", help="write every raw number (and device, torch, threads, date) here")
    p.add_argument("--plot", metavar="PATH", help="save a roofline picture (needs matplotlib: uv run --extra plot)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all; 1 with --quick on CPU)")
    p.add_argument("--tiny", action="store_true", help="toy shapes: checks the harness in seconds, numbers meaningless")
    p.add_argument("--only", metavar="KEY[,KEY]", default="", help="run only these workloads (keys as in the JSON)")
    p.add_argument("--budget", type=float, default=0.0, metavar="S", help="seconds: fewer rounds past half, then stop")
    p.add_argument("--suite", action="store_true", help="the model suite instead: real models through every backend")
    p.add_argument("--models", default="", metavar="A[,B]", help="--suite: these models (default: all)")
    p.add_argument(
        "--backends",
        default="",
        metavar="A[,B]",
        help="--suite: eager,fusion,fusion+cudagraphs,inductor,inductor+reduce-overhead (default: all; CPU: "
        "eager,fusion,inductor)",
    )
    p.add_argument("--sizes", choices=("tiny", "cpu", "full"), help="--suite: model shapes (default: full on cuda, "
                   "tiny on cpu; cpu: batch 1, 224x224 images, small text configs)")  # fmt: skip
    args = p.parse_args(argv)
    if args.plot and not have_matplotlib():
        print(PLOT_HINT, file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"--device cuda: CUDA is not available here (torch {torch.__version__}). Fix: --device cpu", file=sys.stderr
        )
        return 2
    if args.suite:
        from fusion.bench.suite import run_suite

        names = [m for m in args.models.split(",") if m]
        backends = [b for b in args.backends.split(",") if b]
        if not backends or any(b.startswith("fusion") for b in backends):
            register_lessons()  # backend="fusion" is Phase 9's
        return run_lesson(
            lambda: run_suite(
                LESSON,
                models=names,
                backends=backends,
                device=args.device,
                sizes="tiny" if args.tiny else args.sizes,
                threads=args.threads,
                json_path=args.json,
            )
        )
    return run_lesson(
        lambda: run(
            quick=args.quick,
            device=args.device,
            compile=not args.no_compile,
            json_path=args.json,
            plot_path=args.plot,
            sizes="tiny" if args.tiny else None,
            threads=args.threads,
            only=[k for k in args.only.split(",") if k],
            budget_s=args.budget,
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
