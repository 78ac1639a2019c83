"""Phase 4's model suite: real models through every backend, measured as Inductor's dashboard measures a backend.

Per model and backend: **status** (``pass``; ``fail_accuracy``: it ran, the answer is wrong; ``fail_to_run``: it
raised, the reason is its exception; ``unavailable``: its phase is not written here), **accuracy** (the rule below),
**wall-time speed-up** against eager, Inductor's default mode and ``mode="reduce-overhead"`` (interleaved in one
process with the lesson's timing loop: ratios, never absolute claims), **compile time** (the first call) and **peak
memory** (the lesson's measurement). Models come from :mod:`fusion.bench.suite_models`; a model whose package is
missing is a ``skipped`` row with the fix, and one model's failure never stops the others.

The accuracy rule is Inductor's: :mod:`fusion.bench.accuracy`.

On CPU, ``fusion``'s kernels are compiled C (:mod:`fusion.kernels.c_runtime`) and its rows are timed like every other;
where they would run in Triton's interpreter (``FUSION_RENDERER=triton``, or no C compiler) they are checked, never
timed (:data:`INTERPRETER`). ``inductor`` on CPU is Inductor's C++ backend. The meta records the threads and the CPU.

Run it:   uv run python -m fusion.benchmark --suite [--models resnet18,bert] [--backends eager,fusion] [--json PATH]
          uv run python -m fusion.benchmark --suite --device cpu --sizes cpu [--threads N]   (issue 38's CPU suite)
"""

from __future__ import annotations

import copy
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from fusion.bench.accuracy import accuracy, tolerance
from fusion.bench.counting import flat_tensors
from fusion.bench.profile import sync_for
from fusion.bench.results import cpu_meta, fusion_timed, run_meta, save_json
from fusion.bench.rows import ratios_vs
from fusion.bench.rows import summarize as summarize_times
from fusion.bench.suite_models import MODELS, SIZES, SUITE, ModelSkipped, SuiteModel, scalar_loss
from fusion.bench.suite_print import HEADER, geomean, row_lines, summarize, summary_lines  # noqa: F401
from fusion.bench.workloads import VariantUnavailable, lesson
from fusion.common import is_todo
from fusion.kernels import stack_chunks

SCHEMA = "suite-1"
BACKENDS = (
    "eager",
    "fusion",
    "fusion+cudagraphs",
    "fusion+fold",
    "fusion+fold+cudagraphs",
    "inductor",
    "inductor+reduce-overhead",
)
CPU_DEFAULT_BACKENDS = ("eager", "fusion", "inductor")  # on CPU: our C kernels against Inductor's C++ backend
INTERPRETER = "not timed: on CPU its kernels run in Triton's interpreter (correctness only)"
CUDAGRAPHS = (
    "fusion+cudagraphs",
    "fusion+fold+cudagraphs",
    "inductor+reduce-overhead",
)  # outputs live in a graph's pool: clone them

# ----------------------------------------------------------------------------------------------------------------------
# Backends by name


PASS_SWITCHES = {"no": False, "with": True}  # fusion+no-<pass>, fusion+with-<pass>: one pass off, or an opt-in on
# fusion+<flag>: the option it sets. fusion+fold, fusion+cudagraphs: a switch on
FUSION_FLAGS = {"fold": ("fold_bn", True), "cudagraphs": ("cudagraphs", True)}


def is_ablation(backend: str) -> bool:
    """``fusion+`` followed by ``no-<pass>``/``with-<pass>`` switches and flags of :data:`FUSION_FLAGS`, any mix."""
    parts = backend.split("+")
    switched = [p.partition("-")[0] in PASS_SWITCHES for p in parts[1:]]
    flags = [p in FUSION_FLAGS for p in parts[1:]]
    return parts[0] == "fusion" and len(parts) > 1 and all(s or f for s, f in zip(switched, flags, strict=True))


def compile_with(backend: str, model: nn.Module) -> Callable:
    """``model`` as ``backend`` runs it; VariantUnavailable where its phase is not written here."""
    if backend == "eager":
        return model
    if backend.startswith("fusion"):
        lesson("lower")  # Phase 9 registered: "fusion" is a Dynamo backend (the Phase 4 lesson imports fusion.backend)
        # fusion+fold: the opt-in BatchNorm fold (Phase 9's freezing-like promise); +cudagraphs: one CUDA graph;
        # +no-<pass>: that pass off (an ablation: fusion+no-conv1x1 is fusion without pass conv1x1); +with-<pass>:
        # an opt-in pass on (fusion+with-conv1x1_forward)
        options = {}
        for f in backend.split("+")[1:]:
            switch, _, name = f.partition("-")
            if switch in PASS_SWITCHES:
                options[name] = PASS_SWITCHES[switch]
            else:
                option, value = FUSION_FLAGS[f]
                options[option] = value
        return torch.compile(model, backend="fusion", options=options or None)
    if backend == "inductor":
        return torch.compile(model)
    if backend == "inductor+reduce-overhead":
        return torch.compile(model, mode="reduce-overhead")
    raise ValueError(f"unknown backend {backend!r}. Fix: pick from {', '.join(BACKENDS)}")


_WARMED: set[str] = set()  # the compilers whose one-time costs this process has paid (warm_compilers)


class _Warm(nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0 + 1.0).sum()


def warm_compilers(backends: Sequence[str], cfg: SuiteConfig) -> None:
    """Pay each compiler's one-time costs (imports, Dynamo's first use, a compile worker pool) on a throwaway
    function before a model is timed, once per process, so that a model's first call is that model's compile.
    Without it the first compiled backend of a process pays them for every one after it (here fusion before
    Inductor). A compiler that fails here is left to fail, with its reason, on the model itself."""
    x = torch.ones(64, device=cfg.device, dtype=cfg.dtype)
    for name in dict.fromkeys(b.split("+")[0] for b in backends if b != "eager"):
        if name in _WARMED:
            continue
        _WARMED.add(name)
        try:
            compile_with(name, _Warm())(x)
        except Exception:  # noqa: BLE001 - the model's own row says what is wrong with this backend
            pass
        finally:
            torch._dynamo.reset()


def _first_line(e: BaseException) -> str:
    """``Type: first line`` of ``e``, and of its root cause where Dynamo wrapped it (BackendCompilerFailed: ...)."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        parts.append(f"{type(e).__name__}: {lines[0][:160] if lines else ''}")
        e = getattr(e, "inner_exception", None) or e.__cause__
    return parts[0] if len(parts) == 1 else f"{parts[0].split(':')[0]}: {parts[-1]}"


def _raise_todo(e: BaseException | None) -> None:
    """An unsolved exercise (a practice workspace) is not a backend failure: re-raise it for the lesson runner."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if is_todo(e):
            raise e
        e = getattr(e, "inner_exception", None) or e.__cause__


def _snapshot(out: object) -> list[torch.Tensor]:
    return [t.detach().clone() for t in flat_tensors(out)]


# ----------------------------------------------------------------------------------------------------------------------
# One model


@dataclass(frozen=True)
class SuiteConfig:
    device: str = "cpu"
    sizes: str = "tiny"  # "tiny" | "full" (suite_models)
    rounds: int = 3  # interleaved timing rounds; 0: check accuracy only, time nothing
    min_run_time: float = 0.1
    threads: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device == "cuda" else torch.float32


def _to_device(x: torch.Tensor, cfg: SuiteConfig, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = x.to(cfg.device, dtype) if x.is_floating_point() else x.to(cfg.device)
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x


def _runner(spec: SuiteModel, model32: nn.Module, inputs32: tuple, cfg: SuiteConfig, backend: str | None, dtype):
    """A no-argument function that runs one call (inference) or one training step of ``model32`` in ``dtype`` as
    ``backend`` runs it (None: the float64 reference, eager). Each gets its own copy: never the caller's model."""
    cl = spec.image and cfg.device == "cuda" and dtype != torch.float64
    train_dtype = torch.float32 if spec.train and dtype != torch.float64 else dtype  # training: fp32 weights + AMP
    model = copy.deepcopy(model32).to(cfg.device, train_dtype)
    model = model.to(memory_format=torch.channels_last) if cl else model
    inputs = tuple(_to_device(x, cfg, train_dtype if spec.train else dtype, cl) for x in inputs32)
    fn = compile_with(backend or "eager", model)
    if not spec.train:
        model.eval().requires_grad_(False)

        def call():
            with torch.no_grad():
                return fn(*inputs)

        return call
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01)
    amp = cfg.device == "cuda" and dtype in (torch.bfloat16, torch.float16)

    def step():  # forward, backward, optimizer: the loss and every gradient are the step's outputs
        opt.zero_grad(set_to_none=True)
        with torch.autocast(cfg.device, dtype=dtype, enabled=amp):
            out = fn(*inputs)
        loss = scalar_loss(out)
        loss.backward()
        opt.step()
        return (loss.detach(), *[p.grad for p in params])

    return step


def run_model(
    spec: SuiteModel, backends: Sequence[str], cfg: SuiteConfig, lesson, log: Callable[[str], None] = print
) -> dict:
    """Every backend on one model: status, accuracy, speed-ups, compile time, peak memory. Never raises for a
    backend's failure (its row says why)."""
    row: dict = {"model": spec.name, "title": spec.title, "train": spec.train, "status": "ok", "reason": ""}
    row["backends"] = {}
    try:
        model32, inputs32 = spec.build(cfg.sizes)
    except ModelSkipped as e:
        row["status"], row["reason"] = "skipped", str(e)
        return row
    row["inputs"] = [list(x.shape) for x in inputs32]
    sync, dtype, tol = sync_for(cfg.device), cfg.dtype, tolerance(cfg.dtype)
    torch.manual_seed(0)
    try:  # the float64 reference (CPU float64 where the device cannot): what "wrong" is measured against
        fp64 = _snapshot(_runner(spec, model32, inputs32, cfg, None, torch.float64)())
    except Exception as e:
        fp64, row["fp64_reason"] = None, _first_line(e)
    fns: dict[str, Callable] = {}
    ref = None
    warm_compilers(backends, cfg)
    for name in ("eager", *[b for b in backends if b != "eager"]):
        r: dict = {"status": "pass", "reason": ""}
        row["backends"][name] = r
        torch.manual_seed(0)
        try:
            fn = _runner(spec, model32, inputs32, cfg, name, dtype)
            t0 = time.perf_counter()
            first = _snapshot(fn())
            sync()
            r["first_call_s"] = time.perf_counter() - t0  # for a compiled backend: its compile time
            if not spec.train:  # later calls too: CUDA graphs record on the 2nd call and replay from the 3rd
                fn()
                sync()
                later = _snapshot(fn())
        except VariantUnavailable as e:
            r["status"], r["reason"] = "unavailable", str(e)
            continue
        except Exception as e:  # a backend that raises (an option it lacks, an op it cannot take) is a row
            _raise_todo(e)
            r["status"], r["reason"] = "fail_to_run", _first_line(e)
            if name == "eager":
                row["status"], row["reason"] = "eager_fail_to_run", r["reason"]
                return row
            log(f"    {name}: fail_to_run: {r['reason']}")
            continue
        if name == "eager":
            ref = first
        else:
            acc = accuracy(ref, first, fp64, tol)
            if acc.ok and not spec.train:
                acc = accuracy(ref, later, fp64, tol)
            r.update(res_rmse=acc.res_rmse, eager_rmse=acc.eager_rmse, multiplier=acc.multiplier)
            if not acc.ok:
                r["status"], r["reason"] = "fail_accuracy", acc.reason
        r["accuracy"] = "pass" if r["status"] == "pass" else "fail"
        if name.startswith("fusion") and not fusion_timed(cfg.device):
            r["note"] = INTERPRETER  # timing it would time the interpreter
        else:
            fns[name] = _timed(fn, name, cfg)
    _measure(row, fns, cfg, lesson, sync)
    return row


def _timed(fn: Callable, name: str, cfg: SuiteConfig) -> Callable:
    if (name in CUDAGRAPHS or "cudagraphs" in name.split("+")) and cfg.device == "cuda":

        def step():
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the last one's outputs may be overwritten
            return fn()

        return step
    return fn


def _measure(row: dict, fns: dict, cfg: SuiteConfig, lesson, sync) -> None:
    """Time every backend that ran, interleaved (the lesson's loop, one round a call, so each round's blocks are
    known), then peak memory; the ratios per row: of the medians (``speedup_vs_*``) and paired by round
    (``paired_vs_*``: the median over the rounds of the other backend's round time ÷ this one's, each a round's
    median block; the backends of a round run back to back, so the host's drift over the run cancels)."""
    if cfg.rounds <= 0 or "eager" not in fns:
        return
    rounds: dict[str, list[list[float]]] = {name: [] for name in fns}
    for i in range(cfg.rounds):
        timings = lesson.time_variants(
            fns,
            rounds=1,
            min_run_time=cfg.min_run_time,
            warmup=3 if i == 0 else 0,
            sync=sync,
            threads=cfg.threads or torch.get_num_threads(),
        )
        for name in fns:
            rounds[name].append(list(timings[name].times_s))
    for name, fn in fns.items():
        r = row["backends"][name]
        times = [t for blocks in rounds[name] for t in blocks]
        r["median_s"] = statistics.median(times)
        r["times_s"] = [round(t, 9) for t in times]  # every block, per call: the spread behind it
        r["round_s"] = [round(statistics.median(blocks), 9) for blocks in rounds[name]]  # one a round, in order
        r["iqr_s"] = summarize_times(times)[1]
        if cfg.device == "cuda" or name == "eager":  # CPU: compiled code allocates below the dispatcher's view
            r["peak_memory_bytes"] = lesson.peak_memory(fn, cfg.device)
    b = row["backends"]
    for r in b.values():
        if r.get("median_s"):
            for key, base in (("eager", "eager"), ("inductor", "inductor"), ("reduce_overhead", CUDAGRAPHS[1])):
                r[f"speedup_vs_{key}"], r[f"paired_vs_{key}"] = ratios_vs(r, b.get(base, {}))


# ----------------------------------------------------------------------------------------------------------------------
# The suite


def run_suite(
    lesson,
    *,
    models: Sequence[str] = (),
    backends: Sequence[str] = (),
    device: str | None = None,
    sizes: str | None = None,
    rounds: int | None = None,
    threads: int = 0,
    json_path: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run the suite (default: every model, every backend; on CPU tiny shapes, eager, fusion and Inductor's C++).
    ``threads``: torch's threads for the run (0: as they are)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if sizes is not None and sizes not in SIZES:
        raise ValueError(f"unknown sizes {sizes!r}. Fix: one of {', '.join(SIZES)}")
    if threads:
        torch.set_num_threads(threads)
    unknown = [m for m in models if m not in MODELS] + [b for b in backends if b not in BACKENDS and not is_ablation(b)]
    if unknown:
        raise ValueError(
            f"unknown model/backend {unknown}. Fix: models {', '.join(MODELS)}; backends {BACKENDS} "
            "(or fusion+no-<pass>: that pass off; fusion+with-<pass>: an opt-in pass on)"
        )
    backends = tuple(backends) or (BACKENDS if device == "cuda" else CPU_DEFAULT_BACKENDS)
    sizes = sizes or ("full" if device == "cuda" else "tiny")
    # Many short rounds: a CPU-bound row's host speed drifts by ±25 % over seconds on the GPU hosts (the calling
    # thread's own CPU time moves with it), and finer interleaving lets every backend see the same drift. The shared
    # CPU hosts drift too: with 3 rounds EfficientNet-B0's ratio read 0.90 in one run, 0.997 minutes later in 15
    # interleaved rounds of one process (2026-11-28). Tiny shapes are a rehearsal (the tests' dry runs): 3 rounds.
    default_rounds, block_s = (25, 0.04) if device == "cuda" else (3 if sizes == "tiny" else 15, 0.02)
    cfg = SuiteConfig(device, sizes, default_rounds if rounds is None else rounds, block_s, torch.get_num_threads())
    result = {
        "schema": SCHEMA,
        "meta": {
            **run_meta(device),
            "transformers_version": _version("transformers"),
            "torchvision_version": _version("torchvision"),
            "dtype": str(cfg.dtype).removeprefix("torch."),
            "sizes": sizes,
            "backends": list(backends),
            "threads": torch.get_num_threads(),
            "rounds": cfg.rounds,  # interleaved rounds: each backend's round_s holds one median block a round
        },
        "models": [],
    }
    if device == "cpu":
        result["meta"].update(cpu_meta())
    if device == "cuda":  # cuDNN times its algorithms at a shape's first call (FUSION_CUDNN_BENCHMARK=0: heuristics)
        torch.backends.cudnn.benchmark = os.environ.get("FUSION_CUDNN_BENCHMARK", "1") != "0"
        result["meta"]["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    where = f"{device}, {torch.get_num_threads()} threads" if device == "cpu" else device
    log(f"model suite on {where} ({result['meta']['dtype']}, {sizes} shapes): {', '.join(backends)}")
    if device == "cpu":
        m = result["meta"]
        log(f"  {m['cpu_model']}; fusion renderer {m['fusion_renderer']}, {m['c_compiler'] or 'no C compiler'}"[:120])
    log(HEADER)
    for spec in [MODELS[m] for m in models] if models else SUITE:
        row = run_model(spec, backends, cfg, lesson, log)
        result["models"].append(row)
        for line in row_lines(row):
            log(line)
        _free(device, cfg.sizes)
        if json_path:
            save_json(json_path, result)
    # Python's frame-stack chunks (fusion.kernels.stack_chunks): installed at fusion's first compile, for every backend
    result["meta"]["stack_chunks"] = stack_chunks.status()
    result["summary"] = summarize(result["models"], backends)
    log("summary:")
    for line in summary_lines(result["summary"]):
        log(line)
    if json_path:
        save_json(json_path, result)
    return result


def _version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def _free(device: str, sizes: str) -> None:
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()  # Dynamo's caches: the next model's classes share code objects with this one's
    if sizes != "tiny":  # tiny models leave kilobytes; a full collection costs ~0.5 s in a large process (a test's)
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
