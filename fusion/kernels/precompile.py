"""Compile a graph's kernels in parallel before its first call: Triton's (CUDA) in a worker pool, C's (CPU) in
bundles (:func:`precompile_c`, ``fusion.kernels.c_bundle``).

Triton compiles a kernel on its first launch: source → Triton IR → LLVM → PTX → cubin, ~0.1-0.5 s each, one after
another. A model with 200 generated kernels spends most of its first call there. Inductor's answer
(``torch._inductor.async_compile``) is a pool of worker processes that compile every kernel of a graph at once; the
parent then finds each binary in Triton's on-disk cache. We do the same with the public API: each worker imports the
kernel's source file and calls ``fn.warmup(dtypes…, grid=(1,), num_warps=…, **constexprs)``, which compiles for the
argument types it is given (``MockTensor`` pointers, assumed 16-byte aligned as real CUDA tensors are) without
launching. The parent's first launch then hits the cache with the same key (same source, types, alignment, options).

Workers never touch the GPU: the target (e.g. ``cuda:90``) is handed to them, so they create no CUDA context.
They start while the first CUDA graph is traced (:func:`warm_pool`), and never import the parent's main module
(:func:`_submit`).
Anything that fails here only costs time: the parent's first launch compiles the kernel as before.
``FUSION_COMPILE_WORKERS=0`` turns the pool off; the default is one worker per CPU core, at most 8.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence

import torch

from fusion.kernels import c_runtime
from fusion.kernels import triton_lang as tlang
from fusion.kernels.triton_runtime import shared_source, source_path

_POOL: concurrent.futures.ProcessPoolExecutor | None = None
_WARMED: set[tuple[str, tuple, int, tuple]] = set()  # what this process already compiled through the pool


def workers() -> int:
    """How many compile workers: $FUSION_COMPILE_WORKERS, else one per core (at most 8)."""
    env = os.environ.get("FUSION_COMPILE_WORKERS")
    return int(env) if env else min(os.cpu_count() or 1, 8)


def _pool() -> concurrent.futures.ProcessPoolExecutor:
    global _POOL
    if _POOL is not None and getattr(_POOL, "_broken", False):  # a worker died: a new pool, never a broken one
        _POOL = None
    if _POOL is None:
        # spawn, not fork: the parent has CUDA initialised, and a forked CUDA context is unusable.
        _POOL = concurrent.futures.ProcessPoolExecutor(workers(), mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_POOL.shutdown, wait=False, cancel_futures=True)
    return _POOL


def _submit(fn, *args) -> concurrent.futures.Future:
    """``fn(*args)`` in a worker. A spawned worker re-runs the parent's ``__main__`` before its first job
    (multiprocessing does, so that functions defined there unpickle): a learner's script without an
    ``if __name__ == "__main__":`` guard would run again, model, training loop and all, in every worker. Our jobs are
    functions of this module, so the workers are spawned (a pool spawns them in ``submit``) with the main module's
    name and path hidden: they import none."""
    pool = _pool()
    main = sys.modules.get("__main__")
    hidden = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None  # multiprocessing reads both: no module name, no path -> the worker imports no main
    try:
        return pool.submit(fn, *args)
    finally:
        if main is not None:
            main.__dict__.update(hidden)


def warm_pool(example_inputs: Sequence[object]) -> bool:
    """Start the workers now, in the background, where a graph on a CUDA device is about to be traced (once per
    process): each spawns and imports torch and Triton (seconds) while AOTAutograd traces, and the graph's
    :func:`precompile` finds them ready. Inductor warms its compile pool the same way
    (``AsyncCompile.warm_pool``). True where it started them."""
    if _POOL is not None or workers() < 2:
        return False
    if not any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs):
        return False
    try:
        for _ in range(workers()):  # one job each: a pool spawns a worker per job while none is idle
            _submit(_import_in_worker)
    except Exception:  # noqa: BLE001 - no pool now: precompile starts one, or the first launches compile
        return False
    return True


def _import_in_worker() -> str:
    """In a worker: the imports a compile needs (Triton's compiler and its CUDA backend), then nothing."""
    try:
        import triton.compiler  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.runtime import driver  # noqa: F401

        return ""
    except Exception as e:  # noqa: BLE001 - a compile in this worker will say what is missing
        return f"{type(e).__name__}: {e}"


def _compile_in_worker(path: str, name: str, dtypes: tuple[str, ...], num_warps: int, constexprs: dict,
                       target: tuple) -> str:  # fmt: skip
    """In a worker: import the kernel's file, compile it for ``target`` without a GPU; '' or the error."""
    try:
        import importlib.util

        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver

        gpu = GPUTarget(*target)
        active = driver.active
        active.get_current_target = lambda: gpu  # compile for the parent's GPU, creating no CUDA context
        active.get_current_device = lambda: 0
        active.get_current_stream = lambda device=None: 0
        spec = importlib.util.spec_from_file_location(f"fusion_precompile_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, name)
        fn.warmup(*(getattr(torch, d) for d in dtypes), grid=(1,), num_warps=num_warps, **constexprs, **tlang.OPTIONS)
        return ""
    except Exception as e:  # noqa: BLE001 - a failed warm-up only means the parent compiles this one itself
        return f"{type(e).__name__}: {str(e)[:200]}"


def precompile(kernels: Sequence[object]) -> dict[str, object]:
    """Compile ``kernels`` (``RegionKernel`` modules of one graph) in the worker pool; returns what happened:
    ``{"kernels": n, "seconds": wall time, "failed": [reasons]}`` or ``{"skipped": why}``."""
    todo, queued = [], set()  # one compile per distinct (code, types, config) of the graph
    for k in kernels:
        plan = k.plan
        if not plan.inputs or not plan.device.startswith("cuda"):
            continue
        grid, constexprs = k.config(torch.device(plan.device))
        dtypes = tuple(spec.dtype for spec in (*plan.inputs, *plan.stored))
        code = k.kernel  # the Triton source it launches
        source = shared_source(code.source)  # what the first launch will load: kernels of one code compile once
        key = (source, dtypes, k.num_warps, tuple(sorted(constexprs.items())))
        if grid > 0 and key not in _WARMED and key not in queued:
            queued.add(key)
            todo.append((k, code.name, source, dtypes, constexprs, key))
    if len(todo) < 2 or workers() < 2:
        return {"skipped": "fewer than two CUDA kernels to compile, or FUSION_COMPILE_WORKERS < 2"}
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
        target = (target.backend, target.arch, target.warp_size)
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"no Triton target here ({type(e).__name__})"}
    start = time.perf_counter()
    try:
        jobs = [
            _submit(
                _compile_in_worker,
                str(source_path(source, name)),
                name,
                dtypes,
                k.num_warps,
                constexprs,
                target,
            )  # fmt: skip
            for k, name, source, dtypes, constexprs, _ in todo
        ]
    except Exception as e:  # noqa: BLE001 - no pool (a broken one, shut down at exit): the first launches compile
        return {"skipped": f"no compile pool ({type(e).__name__}: {str(e)[:120]})"}
    failed = []
    for (*_, key), job in zip(todo, jobs, strict=True):
        try:
            why = job.result()
        except Exception as e:  # noqa: BLE001 - a dead worker: the parent compiles
            why = f"{type(e).__name__}: {e}"
        if why:
            failed.append(why)
        else:
            _WARMED.add(key)
    return {"kernels": len(todo), "seconds": time.perf_counter() - start, "failed": failed}


def precompile_c(kernels: Sequence[object]) -> dict[str, object]:
    """Compile the C kernels of ``kernels`` (``RegionKernel`` modules of one graph) that run on the CPU from C, all at
    once (``fusion.kernels.c_bundle``: the missing ones in one compiler process per core), before the first call;
    each module then holds its kernel. Returns ``c_bundle``'s summary, or ``{"skipped": why}``. A kernel that fails
    here is compiled alone at its first call, which raises or reports its error as before."""
    from fusion.kernels import c_bundle

    mine = [k for k in kernels if k.renderer == "c" and k.plan.device in ("cpu", "") and k.plan.ir is not None]
    if not mine:
        return {"skipped": "no kernel runs on the CPU from C"}
    try:
        made, summary = c_bundle.compile_kernels([k.plan.ir for k in mine], _c_workers())
    except c_runtime.CompilerMissing as e:
        return {"skipped": str(e)}
    except Exception as e:  # noqa: BLE001 - only time is lost: each kernel compiles alone at its first call
        return {"skipped": f"bundled compile failed ({type(e).__name__}: {str(e)[:300]})"}
    for k, ck in zip(mine, made, strict=True):
        if ck is not None:  # what RegionKernel.c_kernel would compile at the first call
            k.use_c_kernel(ck)
    return summary


def _c_workers() -> int:
    """Compiler processes for a graph's C kernels: $FUSION_COMPILE_WORKERS (0 or 1: one bundle), else the cores this
    process may use, shared among pytest-xdist's workers where it runs in one (they compile at the same time)."""
    env = os.environ.get("FUSION_COMPILE_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, c_runtime.cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
