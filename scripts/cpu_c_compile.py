"""First-call (compile) time of the C renderer's kernels, before and after a change, on cold caches (issue 38).

    uv run python scripts/cpu_c_compile.py parts [--model efficientnet_b0]        # where one kernel's compile goes
    uv run python scripts/cpu_c_compile.py first --before DIR [--rounds 2] [--models a,b] [--inductor]

``parts``: the C sources of a model's kernels (compiled once into a fresh cache), then the compiler run on them in
several ways, each a median of 5: an empty file, the prelude alone, one kernel (-fsyntax-only, -c at -O0/-O3, the
link alone, the whole), every kernel one process each, one translation unit of all, and one per core side by side.

``first``: each (model, variant) in its own process with a fresh ``FUSION_CACHE_DIR`` (and Inductor's cache dir),
the variants interleaved round by round: ``before`` (the code tree DIR first on PYTHONPATH, e.g. a ``git archive`` of
the base commit), ``after`` (this tree), ``inductor``. A process pays the compilers' one-time costs on a throwaway
function first (``suite.warm_compilers``' function), then times the model's first call (compile + run) at the CPU
suite's sizes (``fusion.bench.suite_models``, "cpu"), one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _children_cpu() -> float:
    """User + system CPU seconds of this process's finished child processes (the compilers)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _one_first_call(name: str, backend: str) -> dict:
    """In a worker process: the first call of ``name`` under ``backend`` (caches as the parent set them)."""
    import torch

    torch.set_num_threads(1)
    import fusion.backend  # noqa: F401 - registers backend="fusion" (Phase 9)
    from fusion.bench import suite
    from fusion.bench.suite_models import MODELS
    from fusion.kernels import c_runtime

    model, inputs = MODELS[name].build("cpu")
    model.eval()
    with torch.no_grad():
        suite.compile_with(backend, suite._Warm())(torch.ones(64))
    torch._dynamo.reset()
    bundled = []  # wall seconds of each graph's bundled compile (this tree's c_bundle; absent before it)
    try:
        from fusion.kernels import c_bundle

        plain = c_bundle.compile_kernels

        def timed_compile(*a, **k):
            made, summary = plain(*a, **k)
            bundled.append(summary["seconds"])
            return made, summary

        c_bundle.compile_kernels = timed_compile
    except ImportError:
        pass
    log = Path(os.environ.get("FUSION_C_COMPILE_LOG", os.devnull))
    warm = len(log.read_text().splitlines()) if log.is_file() else 0  # the throwaway function's compiles
    before = dict(c_runtime.STATS)
    cpu0 = _children_cpu()
    start = time.perf_counter()
    with torch.no_grad():
        fn = suite.compile_with(backend, model)
        fn(*inputs)
    first = time.perf_counter() - start
    children_cpu = _children_cpu() - cpu0
    stats = {k: round(v - before.get(k, 0), 3) for k, v in c_runtime.STATS.items()}
    runs = [float(line.split()[1]) for line in log.read_text().splitlines()[warm:]] if log.is_file() else []
    return {
        "model": name,
        "backend": backend,
        "first_call_s": round(first, 3),
        "c_stats": stats,
        "compiler_runs": len(runs),
        "compiler_s_summed": round(sum(runs), 3),
        "children_cpu_s": round(children_cpu, 3),
        "bundled_compile_wall_s": round(sum(bundled), 3),
        "tree": str(Path(c_runtime.__file__).parents[2]),
    }


def first(args) -> None:
    models = args.models.split(",")
    variants = ["before", "after"] + (["inductor"] if args.inductor else [])
    here = Path(__file__).resolve()
    for r in range(args.rounds):
        for name in models:
            for variant in variants:
                cache = tempfile.mkdtemp(prefix="fc_")
                env = dict(os.environ, FUSION_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="ic_"),
                           FUSION_C_COMPILE_LOG=os.path.join(cache, "compiles.log"))  # fmt: skip
                if variant == "before":
                    env["PYTHONPATH"] = args.before
                backend = "inductor" if variant == "inductor" else "fusion"
                code = f"import sys; sys.path.insert(0, {str(here.parent)!r}); import cpu_c_compile as m, json; "
                code += f"print(json.dumps(m._one_first_call({name!r}, {backend!r})))"
                done = subprocess.run(
                    [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir()
                )  # fmt: skip - not this tree: `-c` puts cwd first
                line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else done.stderr[-400:]
                print(f"round {r} {variant:8s} {line}", flush=True)


def _timed(cmd: list[str], repeats: int = 5) -> float:
    """Median wall seconds of ``cmd`` (the median CPU seconds of its processes in ``_timed.cpu``)."""
    times, cpus = [], []
    for _ in range(repeats):
        cpu = _children_cpu()
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
        cpus.append(_children_cpu() - cpu)
    _timed.cpu = statistics.median(cpus)
    return statistics.median(times)


def parts(args) -> None:
    os.environ["FUSION_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="fc_")
    _one_first_call(args.model, "fusion")
    from fusion.kernels import c_runtime
    from fusion.kernels.c_prelude import PRELUDE

    cc, flags, version = c_runtime.compiler()
    libs = c_runtime.libraries(flags)
    print(f"compiler: {version}: {cc} {' '.join(flags)}")
    sources = sorted(Path(cache, "c").glob("k_*.c"))
    sources = [s for s in sources if s.read_text().startswith(PRELUDE)]
    tmp = Path(tempfile.mkdtemp(prefix="cparts_"))
    (tmp / "empty.c").write_text("void f(void) {}\n")
    (tmp / "prelude.c").write_text(PRELUDE + "void f(void) {}\n")
    bodies = [s.read_text()[len(PRELUDE) :] for s in sources]
    (tmp / "all.c").write_text(PRELUDE + "".join(bodies))
    workers = len(os.sched_getaffinity(0))
    for w in range(workers):
        (tmp / f"part{w}.c").write_text(PRELUDE + "".join(bodies[w::workers]))
    sizes = sorted(sources, key=lambda s: s.stat().st_size)
    one = sizes[len(sizes) // 2]  # a kernel of median size
    lib = [cc, *flags]
    so = str(tmp / "out.so")
    o3 = [f for f in flags if f != "-shared"]
    o0 = ["-O0" if f == "-O3" else f for f in o3]
    subprocess.run([cc, *o3, "-c", str(one), "-o", str(tmp / "one.o")], check=True)
    rows = [
        ("empty file, whole (process start, link)", lib + [str(tmp / "empty.c"), "-o", so, *libs]),
        ("prelude alone, whole", lib + [str(tmp / "prelude.c"), "-o", so, *libs]),
        ("one kernel: -fsyntax-only (prelude + kernel parsed)", [cc, *o3, "-fsyntax-only", str(one)]),
        ("one kernel: -c -O0 (parse, no optimisation, assemble)", [cc, *o0, "-c", str(one), "-o", str(tmp / "a.o")]),
        ("one kernel: -c -O3 (parse, -O3 code, assemble)", [cc, *o3, "-c", str(one), "-o", str(tmp / "a.o")]),
        (
            "one kernel: the link alone",
            [cc, "-shared", *[f for f in flags if "openmp" in f], str(tmp / "one.o"), "-o", so, *libs],
        ),  # fmt: skip
        ("one kernel, whole (as c_runtime.load)", lib + [str(one), "-o", so, *libs]),
    ]
    for what, cmd in rows:
        wall = _timed(cmd)
        print(f"{what:56s} wall {wall * 1000:7.1f} ms  cpu {_timed.cpu * 1000:7.1f} ms")
    n = len(sources)

    def each(s: Path) -> None:
        subprocess.run(lib + [str(s), "-o", f"{s}.so", *libs], check=True, capture_output=True)

    def part(w: int) -> None:
        subprocess.run(lib + [str(tmp / f"part{w}.c"), "-o", f"{tmp}/p{w}.so", *libs], check=True)

    ways = [
        (f"{n} kernels, one process each, in turn", lambda: [each(s) for s in sources]),
        (f"{n} kernels, one process each, {workers} at a time", lambda: list(ThreadPoolExecutor(workers).map(each, sources))),
        (f"{n} kernels, one translation unit", lambda: subprocess.run(lib + [str(tmp / "all.c"), "-o", so, *libs], check=True)),
        (f"{n} kernels, {workers} translation units side by side", lambda: list(ThreadPoolExecutor(workers).map(part, range(workers)))),
    ]  # fmt: skip
    for what, run in ways:
        cpu, start = _children_cpu(), time.perf_counter()
        run()
        print(f"{what:56s} wall {time.perf_counter() - start:7.2f} s   cpu {_children_cpu() - cpu:7.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("parts")
    a.add_argument("--model", default="efficientnet_b0")
    b = sub.add_parser("first")
    b.add_argument("--before", required=True, help="the code tree of the base commit (git archive)")
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--models", default="efficientnet_b0,mobilenet_v2,bert")
    b.add_argument("--inductor", action="store_true")
    args = p.parse_args()
    {"parts": parts, "first": first}[args.cmd](args)


if __name__ == "__main__":
    main()
