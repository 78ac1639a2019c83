"""The runtime: a generated kernel's source in, a launch out. Load, check, launch; nothing else.

* :func:`triton_status` — can this machine run Triton at all (installed? a GPU, or the CPU interpreter?).
* :func:`load_kernel` — write the source to a cache directory and import it: ``@triton.jit`` reads the function's
  source with ``inspect``, so a kernel must live in a real file (Inductor's ``PyCodeCache`` does the same). Kernels
  for CPU tensors are defined with ``TRITON_INTERPRET=1`` set (only while their module is imported), so they run in
  Triton's interpreter; kernels for CUDA tensors are compiled by Triton.
* :class:`RegionKernel` — one :class:`~fusion.ir.plan.LaunchPlan` (data alone) as a module: check the inputs
  against what the source was specialised for, allocate the outputs, launch on the grid, return the outputs by the
  plan's recipes (``fusion.ir.views``: a stored tensor, a strided view of one, or aten steps by name).
  ``_launcher(inputs)`` returns the bare launch (the timing module launches it alone).
* :class:`Launcher` — the call a compiled graph makes per kernel: inputs checked on the first call only, outputs
  from precomputed specs, and on CUDA the compiled kernel's own launcher instead of the JIT's dispatch (those
  launchers, torch's static one and Triton's, live in ``fusion.kernels.launchers``).

The graph around the launches is built by ``fusion.compiler.partition``; GPU timings live in ``fusion.kernels.timing``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fusion.aten.nodes import reinterpret, same_layout
from fusion.ir.plan import GeneratedKernel, Kernel, KernelPlan, LaunchPlan
from fusion.ir.views import Take, extent, runner
from fusion.kernels import c_runtime, interp_check
from fusion.kernels import triton_lang as tlang
from fusion.kernels.launchers import direct_launcher, static_launcher

__all__ = ["GeneratedKernel", "Kernel", "KernelPlan", "LaunchPlan", "Launcher", "RegionKernel", "ShapeMismatchError"]
__all__ += ["cache_dir", "load_kernel", "triton_status"]

# ----------------------------------------------------------------------------------------------------------------------
# Is Triton here?


def triton_status() -> tuple[bool, str]:
    """(can we run generated kernels, why not / how). Never raises."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # macOS wheels, a torch build without Triton, a broken install
        return False, f"Triton is not installed here ({type(e).__name__}: {e}); the source can be printed, not run"
    how = "on the GPU" if torch.cuda.is_available() else "in Triton's CPU interpreter (TRITON_INTERPRET=1)"
    return True, f"Triton {triton.__version__} runs the kernels {how}"


@contextlib.contextmanager
def _interpret(on: bool):
    """TRITON_INTERPRET set (or cleared) while a kernel module is imported: ``@triton.jit`` reads it at definition."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def cache_dir() -> Path:
    """Where generated kernels are written: $FUSION_CACHE_DIR, else <tmp>/fusion_kernels_<user>."""
    root = os.environ.get("FUSION_CACHE_DIR")
    if not root:
        user = os.environ.get("USER") or os.environ.get("USERNAME") or str(os.getuid() if hasattr(os, "getuid") else 0)
        root = os.path.join(tempfile.gettempdir(), f"fusion_kernels_{user}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


_LOADED: dict[tuple[str, bool], object] = {}
_LOAD_LOCK = threading.Lock()  # one compiled module called from several threads loads each kernel once


def source_path(source: str, name: str) -> Path:
    """``<cache_dir>/<name>_<hash>.py`` holding ``source`` (written atomically if it is not there yet)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)  # atomic: a parallel test worker never imports half a file
    return path


_SHARED: dict[str, str] = {}  # a kernel's code without comments -> the first source seen with that code


def shared_source(source: str) -> str:
    """The source this process loads for ``source``: the first one seen with the same code, comments aside (kernels
    of repeated layers share a name and differ only in the comments naming their nodes). What the compile pool
    compiles and what the first launch loads are then one file, and Triton compiles it once."""
    return _SHARED.setdefault(tlang.code_only(source), source)


def load_kernel(source: str, name: str, *, interpret: bool) -> object:
    """Write ``source`` to ``<cache_dir>/<name>_<hash>.py``, import it, return its function ``name``.

    One module per (code, interpret): loading a source whose code was loaded before, comments aside
    (:func:`shared_source`), returns the same (already compiled) kernel.
    Thread-safe: the import (and TRITON_INTERPRET, which it reads from the environment) happens under a lock.
    """
    source = shared_source(source)
    key = (source, interpret)
    kernel = _LOADED.get(key)
    if kernel is not None:
        return kernel
    with _LOAD_LOCK:
        if key in _LOADED:
            return _LOADED[key]
        path = source_path(source, name)
        module_name = f"fusion_kernels.{path.stem}{'_interp' if interpret else ''}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # inspect.getsource finds the file through the module
        if interpret:
            interp_check.exact_bfloat16_in_the_interpreter()
        with _interpret(interpret):
            spec.loader.exec_module(module)
        kernel = getattr(module, name)
        kernel = _LOADED[key] = _Interpreted(kernel) if interpret else kernel
    return kernel


_INTERPRET_LOCK = threading.Lock()


class _Interpreted:
    """A kernel for Triton's interpreter: it patches ``triton.language`` while a kernel runs, so two threads
    interpreting at once break each other. One interpreted launch at a time (CPU runs are for correctness only),
    each load and store checked to stay inside the launch's tensors (``interp_check``: an error, never a crash)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def run(*args, **kwargs):
            with _INTERPRET_LOCK, interp_check.launch(self.fn, args), interp_check.device_asserts(self.fn):
                return launch(*args, **kwargs)  # every load/store checked in bounds, every device_assert run

        return run

    def __getattr__(self, name: str):
        return getattr(self.fn, name)


# ----------------------------------------------------------------------------------------------------------------------
# One generated kernel and its launch


class ShapeMismatchError(ValueError):
    """A compiled kernel was called with tensors of another shape/stride/dtype than it was generated for."""


class RegionKernel(torch.nn.Module):
    """One region = one launch. Called with the region's external inputs, returns its external outputs (a tuple).

    ``forward`` checks the inputs at every call (Phase 8's lesson calls it directly); a compiled graph calls
    :attr:`launch` (a :class:`Launcher`) instead: no ``Module.__call__``, the check on its first call only.
    """

    def __init__(self, plan: LaunchPlan) -> None:
        super().__init__()
        self.plan = plan
        self._compiled: dict[bool, object] = {}
        # Decided once, not per call (the per-call Python is what a small kernel's wall time is made of).
        self._out_specs = [(s.shape, s.stride, getattr(torch, s.dtype)) for s in plan.stored]
        self._in_dtypes = [getattr(torch, s.dtype) for s in plan.inputs]
        self._configs: dict[str, tuple[int, dict[str, int]]] = {}  # device type -> (programs, constexprs)
        self.renderer = c_runtime.chosen()  # of CPU launches: "c" (fusion.kernels.c_runtime) or "triton"
        self.ran, self.c_refused = "", ""  # what ran the kernel ("c", "triton-interpreter", "triton"); why not C
        self.launch = Launcher(self)

    @property
    def kernel(self) -> LaunchPlan:
        """The kernel's name, source, kind and ops: the plan holds them (the region stays with the compiler)."""
        return self.plan

    def _function(self, interpret: bool):
        fn = self._compiled.get(interpret)
        if fn is None:
            fn = self._compiled[interpret] = load_kernel(self.kernel.source, self.kernel.name, interpret=interpret)
        return fn

    @property
    def num_warps(self) -> int:
        return self.plan.num_warps

    def c_kernel(self, device: torch.device):
        """The kernel compiled from C for CPU tensors, where the renderer is C and the region lowers to the kernel
        IR; None otherwise (Triton runs it; ``c_refused`` says why not C)."""
        if device.type != "cpu" or self.renderer != "c":
            return None
        if "c" not in self._compiled:
            self._compiled["c"], self.c_refused = c_runtime.kernel_for(self.plan)
        return self._compiled["c"]

    def use_c_kernel(self, kernel) -> None:
        """The C kernel ``c_kernel`` would compile at the first call, compiled already (with the graph's others:
        ``precompile.precompile_c``)."""
        self._compiled["c"], self.c_refused = kernel, ""

    def check(self, inputs: Sequence[torch.Tensor]) -> None:
        """Raise :class:`ShapeMismatchError` unless every input has the shape, strides and dtype generated for."""
        for want, t, dtype in zip(self.plan.inputs, inputs, self._in_dtypes, strict=True):
            if (
                t.shape != want.shape
                or t.dtype != dtype
                or (t.stride() != want.stride and not same_layout(t, want.stride))
            ):
                raise ShapeMismatchError(
                    f"{self.kernel.name}: input {want.name} is {tuple(t.shape)} stride {tuple(t.stride())} {t.dtype}, "
                    f"but the kernel was generated for {want.shape} stride {want.stride} {dtype}. Fix: compile again "
                    "with example inputs of the shapes (and memory layout) you call it with"
                )

    def config(self, device: torch.device) -> tuple[int, dict[str, int]]:
        config = self._configs.get(device.type)
        if config is None:
            config = self._configs[device.type] = self.plan.launch_config(device)
        return config

    def _launcher(self, inputs: Sequence[torch.Tensor]) -> tuple[Callable[[], None], list[torch.Tensor]]:
        """Check the inputs, allocate the outputs; return (launch once through Triton's JIT, the outputs it writes)."""
        self.check(inputs)
        device = inputs[0].device if inputs else torch.device("cpu")
        outs = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in self._out_specs
        ]
        if (c := self.c_kernel(device)) is not None:
            self.ran = "c"
            return functools.partial(c, *inputs, *outs), outs
        fn = self._function(interpret=device.type != "cuda")
        grid, constexprs = self.config(device)
        self.ran = "triton" if device.type == "cuda" else "triton-interpreter"

        def launch() -> None:
            if grid > 0:
                fn[(grid,)](*inputs, *outs, num_warps=self.num_warps, **constexprs, **tlang.OPTIONS)

        return launch, outs

    def forward(self, *inputs: torch.Tensor) -> tuple:
        launch, outs = self._launcher(inputs)
        launch()
        return self.launch.results(inputs, outs)


def _into(buffer: torch.Tensor, shape, stride, dtype, alloc, need: int) -> torch.Tensor:
    """An output of (shape, stride, dtype), ``need`` bytes from its start, in ``buffer``'s storage (a buffer the graph
    is done with), or a new one where the buffer is not of that dtype, or is smaller (planned never to happen: a
    check, not a path). One ``reinterpret`` (Inductor's, no dispatch: ~1 us against ``as_strided``'s ~3 on a GPU
    host), as Inductor's wrapper views a reused buffer; the buffer is a fresh tensor of the graph's (never a view
    that overlaps itself), so its ``nbytes`` is memory its storage has."""
    if buffer.dtype is dtype and buffer.storage_offset() == 0 and buffer.nbytes >= need:
        return reinterpret(buffer, shape, stride, 0)
    return alloc(shape, stride, dtype)


class Launcher:
    """A kernel's launch as a compiled graph calls it: ``launch(*inputs) -> outputs``, the least Python per call.

    * The first call checks the inputs (:meth:`RegionKernel.check`) and launches through Triton's JIT (which
      compiles). Later calls trust them: the graph's entry is checked (Dynamo's guards in the backend,
      ``CompiledGraph.check_inputs`` otherwise) and every tensor inside the graph follows from it.
    * Outputs come from precomputed (shape, stride, dtype, device).
    * On CUDA, later calls skip the JIT's dispatch (argument binding, specialisation key, cache lookup: ~20-30 µs)
      and call the compiled kernel's launcher directly, as Inductor's ``CachingAutotuner`` does:
      ``CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata, enter_hook,
      exit_hook, *args)`` (Triton 3.4-3.9). Any failure of that path falls back to the JIT call for good, recorded
      in :attr:`fallback` (a kernel only writes its outputs, so launching again is safe): never a wrong answer.
    * Triton specialises a kernel on which pointers are 16-byte aligned: a call whose input lost the alignment it
      was compiled with (a slice of a user's tensor) goes through the JIT, which compiles that variant.
    * In Triton's CPU interpreter everything stays the JIT call (the kernel's own Python dominates there).
    """

    def __init__(self, owner: RegionKernel) -> None:
        self.owner = owner
        self.__name__ = self.__qualname__ = owner.kernel.name  # how the compiled graph's code names it
        self.checked = False
        self.direct: Callable | None = None  # (*inputs, *outs) -> None once the compiled kernel is known (CUDA)
        self.fallback = ""  # why the direct path is off ("" while it is on, or untried)
        self.launches = 0  # calls through the direct path
        self.kind = ""  # which direct path: "static" (torch's static launcher), "triton" (Triton's own) or "c"
        self.static_refused = ""  # why torch's static launcher was not used, if it was not
        self.spy: Callable | None = None  # timing.kernel_gpu_us and launch_us record a call's inputs through this
        plan = owner.plan
        self._rebuild = [runner(r) for r in plan.results]  # each result from the launch's buffers, by its recipe
        stored = [Take(len(plan.inputs) + i) for i in range(len(plan.stored))]
        self._plain = list(plan.results) == stored  # the outputs are the stored tensors, in order
        self.alloc: Callable | None = None  # (size, stride, dtype) -> an output on the inputs' device: the 1st call
        self._specs: list[tuple] = []
        self._aligned: list[int] = []  # inputs whose pointer was 16-byte aligned when the kernel was compiled
        self.donated: tuple[int, ...] = ()  # outputs written into buffers passed after the inputs (memory_plan)

    def results(self, inputs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> tuple:
        """The region's external outputs from the call's inputs and the kernel's stored tensors."""
        buffers = (*inputs, *outs)
        return tuple(rebuild(buffers) for rebuild in self._rebuild)

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        given = ()
        if self.donated:  # buffers the graph is done with, for these outputs (fusion.compiler.memory_plan)
            given, inputs = inputs[len(inputs) - len(self.donated) :], inputs[: len(inputs) - len(self.donated)]
        if self.spy is not None:
            self.spy(inputs)
        direct = self.direct
        if direct is None:
            return self._first(inputs)
        for i in self._aligned:  # Triton specialised the kernel on 16-byte aligned pointers: is this one still?
            if inputs[i].data_ptr() & 15:
                return self._first(inputs)
        alloc = self.alloc
        if given:
            outs = [alloc(*spec) if k is None else _into(given[k], *spec, alloc, need) for spec, k, need in self._slots]
        else:
            outs = [alloc(s, st, dt) for s, st, dt in self._specs]
        try:
            direct(*inputs, *outs)
        except IndexError:  # an index out of range (a C kernel's check): the caller's input, as eager raises it
            raise
        except Exception as e:  # noqa: BLE001 - any failure: the JIT call, from now on
            self.direct = None
            self.fallback = f"direct launch failed ({type(e).__name__}: {str(e)[:120]}); Triton's JIT call from now on"
            self.checked = True
            return self._first(inputs)
        self.launches += 1
        return tuple(outs) if self._plain else self.results(inputs, outs)

    def _first(self, inputs: Sequence[torch.Tensor]) -> tuple:
        """Check (once), allocate, launch through the JIT; on CUDA keep the compiled kernel's launcher."""
        owner = self.owner
        if not self.checked:
            owner.check(inputs)
            self.checked = True
        device = inputs[0].device if inputs else torch.device("cpu")
        self.alloc = alloc = empty_strided_on(device)
        self._specs = owner._out_specs
        slot = {i: k for k, i in enumerate(self.donated)}
        # (spec, which donated buffer, bytes from the output's start to its last element's end)
        self._slots = [(spec, slot.get(i), extent(*spec[:2]) * spec[2].itemsize) for i, spec in enumerate(self._specs)]
        outs = [alloc(s, st, dt) for s, st, dt in self._specs]
        if not self.fallback and (c := owner.c_kernel(device)) is not None:  # CPU tensors, C: later calls call it
            owner.ran, self.kind = "c", "c"
            self.direct = self.direct or c
            c(*inputs, *outs)
            return self.results(inputs, outs)
        fn = owner._function(interpret=device.type != "cuda")
        grid, constexprs = owner.config(device)
        owner.ran = "triton" if device.type == "cuda" else "triton-interpreter"
        if grid > 0:
            compiled = fn[(grid,)](*inputs, *outs, num_warps=owner.num_warps, **constexprs, **tlang.OPTIONS)
            if device.type == "cuda" and not self.fallback:
                try:
                    # Only an input that can move checks its alignment per call: a graph input or a view (a slice
                    # may start anywhere). Anything else is a fresh allocation of this graph (512-byte aligned).
                    self._aligned = [
                        i for i, (t, spec) in enumerate(zip(inputs, owner.plan.inputs, strict=True))
                        if t.data_ptr() % 16 == 0 and spec.movable
                    ]  # fmt: skip
                    self.direct, self.kind = static_launcher(compiled, grid, len(inputs) + len(outs), device), "static"
                except Exception as e:  # noqa: BLE001 - no static launcher in this torch: Triton's own
                    self.static_refused = f"{type(e).__name__}: {str(e)[:120]}"
                    try:
                        self.direct = direct_launcher(fn, compiled, grid, len(inputs) + len(outs), constexprs, device)
                        self.kind = "triton"
                    except Exception as e:  # noqa: BLE001 - an older/newer Triton: keep the JIT call
                        self.fallback = f"no direct launcher ({type(e).__name__}: {str(e)[:120]})"
        return self.results(inputs, outs)


FAST_CPU = getattr(torch._C._dynamo.guards, "_empty_strided_cpu", None)  # Inductor's CPU allocator


def _empty_strided_cpu(size, stride, dtype):
    """A CPU output through :data:`FAST_CPU` (0.5 against 1.2 us a call), looked up at each call: the fuzzer's guard
    zones (tests/test_fuzz.py) replace it to see every output."""
    return FAST_CPU(size, stride, dtype)


def empty_strided_on(device: torch.device) -> Callable:
    """``alloc(size, stride, dtype)``: an uninitialised tensor on ``device``. On a host with one CUDA device, the
    allocator Inductor's output code calls (``torch._C._dynamo.guards._empty_strided_cuda``: straight to the caching
    allocator, no argument parsing or dispatch; it allocates on the *current* device, which one device makes this
    one); on the CPU its twin ``_empty_strided_cpu``; ``torch.empty_strided(..., device=device)`` otherwise."""
    fast = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)
    if device.type == "cuda" and fast is not None and torch.cuda.device_count() == 1:
        return fast
    if device.type == "cpu" and FAST_CPU is not None:
        return _empty_strided_cpu
    return functools.partial(_empty_strided, device=device)


def _empty_strided(size, stride, dtype, *, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)
