"""The loop that runs Phase 4's benchmark: build every variant of every workload, check it against eager, count its
bytes, time the variants interleaved, measure memory, profile the GPU, and return every number as one dict (the
JSON's schema, ``SCHEMA_VERSION``). One variant's record and the numbers of its row are ``fusion.bench.rows``.

The lesson (``fusion.benchmark``) hands in the three functions the learner writes — the roofline, the timing loop,
the peak-memory measurement — as a :class:`Lesson`; nothing here imports the lesson.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.fx as fx
import torch.nn as nn

from fusion.bench.accuracy import acceptable, float64_of, max_diffs
from fusion.bench.config import SIZES, Config
from fusion.bench.counting import NodeCost, flop_count, graph_costs, intermediate_bytes, kernels_bound, min_bytes
from fusion.bench.profile import Peaks, gpu_profile, measure_peaks, sync_for
from fusion.bench.results import run_meta, save_json
from fusion.bench.rows import Variant, generated_kernels, row_metrics, summarize
from fusion.bench.workloads import (
    TRITON_INTERPRETER,
    VariantSpec,
    VariantUnavailable,
    Workload,
    WorkloadSkipped,
    prepare,
    prepare_inputs,
    workloads,
)
from fusion.common import is_todo, report_of, trace_module

SCHEMA_VERSION = 2  # 2: titles carry no bound label; eager_kernels (a count); skipped; per variant timed, max_abs_diff,
# first_call_s, generated (Phase 8's kernels: predicted vs measured), gpu_vs_bound; gpu.by_name
INTERPRETER_MAX_NUMEL = 2**16  # on CPU, generated kernels run in Triton's interpreter (~1 ms per program): tiny only


@dataclass(frozen=True)
class Lesson:
    """The learner's functions from ``fusion.benchmark`` that the harness calls."""

    roofline: Callable[..., object]  # (flops, nbytes, peaks) -> .flops .nbytes .intensity .bound_s .bound_by
    time_variants: Callable[..., dict]  # (fns, *, rounds, min_run_time, warmup, sync, threads) -> {name: Timing}
    peak_memory: Callable[[Callable[[], object], str], int | None]  # (fn, device) -> bytes


def _report_rows(gm: object) -> list[dict] | None:
    try:
        rep = report_of(gm)
    except (KeyError, AttributeError, TypeError):
        return None
    return [{"pattern": d.pattern, "nodes": list(d.nodes), "fused": d.fused, "reason": d.reason} for d in rep.decisions]


def _failure(e: BaseException) -> str:
    text = str(e).splitlines()[0][:160] if str(e) else ""
    return f"failed: {type(e).__name__}: {text}"


def _costs(mod: object, inputs: tuple[torch.Tensor, ...]) -> list[NodeCost] | None:
    """Per-node costs of an FX-traceable module, None for anything else (compiled code, untraceable models)."""
    try:
        gm = mod if isinstance(mod, fx.GraphModule) else trace_module(mod)
        return graph_costs(gm, *inputs)
    except Exception:
        return None


def _build(spec: VariantSpec, src: nn.Module, inputs: tuple, config: Config) -> tuple[object | None, Variant]:
    v = Variant(spec.name, spec.label)
    cpu_triton = spec.triton and config.device != "cuda"
    if spec.cuda_only and config.device != "cuda":
        v.available, v.reason = False, spec.cuda_only
        return None, v
    if cpu_triton and sum(t.numel() for t in inputs) > INTERPRETER_MAX_NUMEL:
        v.available, v.reason = False, f"{TRITON_INTERPRETER} (inputs too large for it here; tests check it)"
        return None, v
    try:
        mod = spec.build(src, inputs, config)
    except VariantUnavailable as e:
        v.available, v.reason = False, str(e)
        return None, v
    except Exception as e:  # a broken pass must not cost the other measurements; the table says what happened
        v.available, v.reason = False, _failure(e)
        return None, v
    if cpu_triton:
        v.timed, v.reason = False, TRITON_INTERPRETER
    v.fusion_report = _report_rows(mod)
    return mod, v


def run_workload(
    w: Workload, config: Config, peaks: Peaks, threads: int, log: Callable[[str], None], lesson: Lesson, rounds: int
) -> dict:
    """Build, check and time the variants of one workload; return its raw numbers as a dict."""
    s, device = SIZES[config.sizes], config.device
    sync = sync_for(device)
    model32, inputs32 = w.build()
    variants: dict[str, Variant] = {"eager": Variant("eager", "eager")}
    fp32: dict[str, nn.Module] = {"eager": model32}
    modules: dict[str, object] = {}

    # FX passes first, on the float32 CPU model (prepare() moves modules in place)
    for spec in w.variants:
        if spec.stage != "fp32":
            continue
        if spec.on and spec.on not in fp32:
            variants[spec.name] = Variant(spec.name, spec.label, False, f"it is built on '{spec.on}', not available")
            continue
        mod, variants[spec.name] = _build(spec, fp32[spec.on or "eager"], inputs32, config)
        if mod is not None:
            fp32[spec.name] = mod
    eager = prepare(model32, config, w.channels_last)
    inputs = prepare_inputs(inputs32, config, w.channels_last)
    modules["eager"] = eager
    for name, mod in fp32.items():
        if name != "eager":
            modules[name] = prepare(mod, config, w.channels_last)
    del model32, inputs32, fp32
    for spec in w.variants:  # generated kernels and compilers: built on the device model for these inputs
        if spec.stage == "device":
            mod, variants[spec.name] = _build(spec, eager, inputs, config)
            if mod is not None:
                modules[spec.name] = mod
    if config.compile:
        note = " (on CPU Inductor generates and builds C++: tens of seconds)" if device == "cpu" else ""
        log(f"    torch.compile: compiling {w.key}{note} ...")
        variants["compile"] = Variant("compile", w.compile_label)
        modules["compile"] = torch.compile(eager)

    # Same answer first: a fast wrong model is not a result. The first call also compiles what compiles lazily.
    ref = eager(*inputs)
    sync()
    fp64 = float64_of(eager, inputs)  # computed only where allclose is not enough
    for name in list(modules):
        v = variants[name]
        t0 = time.perf_counter()
        try:
            out = modules[name](*inputs)
            sync()
        except Exception as e:
            v.available, v.reason = False, _failure(e)
            del modules[name]
            log(f"    {name} failed: {v.reason}")
            continue
        v.first_call_s = time.perf_counter() - t0
        if name == "compile":
            v.compile_s = v.first_call_s
            log(f"    torch.compile: first call took {v.compile_s:.1f} s")
        v.max_rel_diff, v.max_abs_diff = max_diffs(out, ref) if name != "eager" else (0.0, 0.0)
        v.outputs_match, text = acceptable(out, ref, fp64) if name != "eager" else (True, "")
        if not v.outputs_match:
            log(f"    WARNING: {name} differs from eager: {text}")
        del out

    # Costs: every node of the eager graph and of each FX-fused graph, from ShapeProp's shapes on the real inputs
    costs = {"eager": _costs(eager, inputs)}
    for name, mod in modules.items():
        if name not in ("eager", "compile") and variants[name].timed and isinstance(mod, nn.Module):
            if next((sp for sp in w.variants if sp.name == name and sp.stage == "fp32"), None):
                costs[name] = _costs(mod, inputs)
    eager_costs = costs["eager"]
    flops = sum(c.flops for c in eager_costs) if eager_costs else flop_count(eager, inputs)
    roof = lesson.roofline(flops, min_bytes(eager, inputs, ref), peaks)

    def bound_s(f: int, b: int) -> float:
        return lesson.roofline(f, b, peaks).bound_s

    eager_kernels_s = kernels_bound(eager_costs, bound_s, peaks.bytes_per_s) if eager_costs else None
    eager_inter = intermediate_bytes(eager_costs) if eager_costs else None
    del ref, fp64

    fns = {name: (lambda mod=mod: mod(*inputs)) for name, mod in modules.items() if variants[name].timed}
    timings = lesson.time_variants(
        fns, rounds=rounds, min_run_time=s.min_run_time, warmup=3, sync=sync, threads=threads
    )
    for name, fn in fns.items():
        if device == "cuda" or name != "compile":  # CPU: compiled code allocates below the dispatcher's view
            variants[name].peak_memory_bytes = lesson.peak_memory(fn, device)
        if device == "cuda":  # what the GPU did per call: kernel time, kernel count, every kernel by name
            variants[name].gpu = gpu_profile(fn)

    eager_median = timings["eager"].median_s
    device_built = {sp.name for sp in w.variants if sp.stage == "device"}
    for name, v in variants.items():
        if name in modules:
            v.generated = generated_kernels(modules[name], v.gpu, peaks)
        if name not in timings:
            continue
        v.times_s = list(timings[name].times_s)
        v.median_s = timings[name].median_s
        v.iqr_s = summarize(v.times_s)[1]
        c = costs.get(name)
        if c:
            v.intermediate_bytes = intermediate_bytes(c)
            v.kernel_paths = sorted({x.kernel_path for x in c if x.kernel_path})
            v.bytes_removed = None if eager_inter is None else eager_inter - v.intermediate_bytes
            v.kernels_bound_s = kernels_bound(c, bound_s, peaks.bytes_per_s)
            v.kernels = len(c)
        elif name == "compile" or name in device_built:  # kernels we cannot count: the ideal, one kernel in all
            v.kernels_bound_s = roof.bound_s
        m = row_metrics(v.median_s, eager_median, roof, eager_kernels_s, v.kernels_bound_s)
        v.speedup_vs_eager, v.pct_of_limit, v.gbps, v.tflops = m.speedup_vs_eager, m.pct_of_limit, m.gbps, m.tflops
        v.predicted_speedup = m.predicted_speedup
        eager_gpu = variants["eager"].gpu
        if v.gpu and v.gpu.get("gpu_s"):
            v.overhead_s = v.median_s - v.gpu["gpu_s"]
            v.gpu_vs_bound = v.gpu["gpu_s"] / roof.bound_s
            if eager_gpu and eager_gpu.get("gpu_s"):
                v.gpu_speedup = eager_gpu["gpu_s"] / v.gpu["gpu_s"]

    return {
        "key": w.key,
        "title": w.title,
        "shape": w.shape,
        "dtype": str(config.dtype).removeprefix("torch."),
        "channels_last": w.channels_last,
        "flops": roof.flops,
        "min_bytes": roof.nbytes,
        "intensity": roof.intensity,
        "bound_s": roof.bound_s,
        "bound_by": roof.bound_by,
        "eager_kernels_bound_s": eager_kernels_s,
        "eager_kernels": len(eager_costs) if eager_costs else None,
        "eager_intermediate_bytes": eager_inter,
        "nodes": {name: [asdict(x) for x in c] for name, c in costs.items() if c},
        "variants": [asdict(v) for v in variants.values()],
    }


def _record_error(result: dict, w: Workload, e: BaseException, log: Callable[[str], None]) -> None:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    log(f"    FAILED: {w.key}: {type(e).__name__}: {e}\n{text}")
    result["errors"].append({"workload": w.key, "error": f"{type(e).__name__}: {e}", "traceback": text})


def _free(config: Config) -> None:
    """Drop the last workload's models and compiled code before the next one (GPU memory, Dynamo's caches). Toy
    shapes (``--tiny``, the tests') leave kilobytes: no full collection, which costs ~0.5 s in a large process such as
    a test worker."""
    if "torch._dynamo" in sys.modules:  # importing Dynamo costs seconds: only when something compiled
        torch._dynamo.reset()
    if config.sizes != "tiny":
        gc.collect()
    if config.device == "cuda":
        torch.cuda.empty_cache()


def benchmark(
    config: Config,
    lesson: Lesson,
    log: Callable[[str], None] = print,
    json_path: str | None = None,
    check_targets: Callable[[dict], list[dict]] | None = None,
) -> dict:
    """Run every workload under ``config``; return (and, with ``json_path``, save after each workload) every number."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"--device cuda, but CUDA is not available (torch {torch.__version__}, built with CUDA "
            f"{torch.version.cuda}). Fix: run with --device cpu, or on a machine with a GPU"
        )
    known = [w.key for w in workloads(dataclasses.replace(config, only=()))]
    unknown = sorted(set(config.only) - set(known))
    if unknown:
        raise ValueError(f"--only: no workload {unknown}. Fix: pick from {', '.join(known)}")
    start = time.perf_counter()
    threads = config.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(config.seed)
    if config.device == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest conv for every variant
    s = SIZES[config.sizes]
    result: dict = {
        "schema": SCHEMA_VERSION,
        "complete": False,
        "meta": {
            **run_meta(config.device),
            "threads": threads,
            "cpu_count": os.cpu_count(),
            "seed": config.seed,
            "dtype": str(config.dtype).removeprefix("torch."),
            "sizes": config.sizes,
            "quick": config.quick,
            "compile": config.compile,
            "only": list(config.only),
            "budget_s": config.budget_s,
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if config.device == "cuda" else None,
        },
        "workloads": [],
        "skipped": [],
        "errors": [],
    }
    with torch.no_grad():
        log(f"measuring this machine's peaks ({config.device}, {result['meta']['dtype']}) ...")
        peaks = measure_peaks(
            lesson.time_variants,
            device=config.device,
            dtype=config.dtype,
            copy_numel=s.copy_numel,
            matmul_n=s.matmul_n,
            min_run_time=max(s.min_run_time / 2, 0.01),
            threads=threads,
            seed=config.seed,
        )
        result["peaks"] = asdict(peaks)
        log(
            f"  bandwidth {peaks.bytes_per_s / 1e9:.1f} GB/s (copy of {peaks.copy_bytes / 2e6:.0f} MB, read+write), "
            f"compute {peaks.flops_per_s / 1e12:.3g} TFLOP/s ({peaks.matmul_n}³ matmul), "
            f"ridge {peaks.ridge:.1f} FLOP/byte"
        )
        for w in workloads(config):
            elapsed = time.perf_counter() - start
            if w.skip or (config.budget_s and elapsed > config.budget_s):
                why = w.skip or f"over the time budget ({elapsed:.0f} s of {config.budget_s:.0f} s spent)"
                result["skipped"].append({"workload": w.key, "title": w.title, "reason": why})
                log(f"  {w.key}: skipped: {why}")
                continue
            rounds = s.rounds if not config.budget_s or elapsed < config.budget_s / 2 else min(s.rounds, 2)
            log(f"  {w.key}: {w.shape}" + (f" ({rounds} rounds: past half the budget)" if rounds < s.rounds else ""))
            try:
                result["workloads"].append(run_workload(w, config, peaks, threads, log, lesson, rounds))
            except WorkloadSkipped as e:
                result["skipped"].append({"workload": w.key, "title": w.title, "reason": str(e)})
                log(f"    skipped: {e}")
            except NotImplementedError as e:
                if is_todo(e):
                    raise  # an unsolved exercise of this phase: the lesson runner shows it as TODO
                _record_error(result, w, e, log)
            except Exception as e:  # one broken workload (an OOM, a pass bug) must not cost the others
                _record_error(result, w, e, log)
            _free(config)
            if json_path:
                save_json(json_path, result)
    result["complete"] = True
    result["seconds"] = time.perf_counter() - start
    result["targets"] = check_targets(result) if check_targets else []
    if json_path:
        save_json(json_path, result)
    return result
