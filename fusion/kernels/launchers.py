"""The direct launch of a compiled Triton kernel on CUDA: what :class:`~fusion.kernels.triton_runtime.Launcher` calls
after a kernel's first call instead of the JIT's dispatch (argument binding, specialisation key, cache lookup).

* :func:`static_launcher` — torch's static launcher, the one Inductor uses: the cubin loaded once, each launch one
  C++ call; with :func:`_raw_launch`, the C++ launch its ``run()`` ends in, called directly.
* :func:`direct_launcher` — Triton's own compiled launcher (``CompiledKernel.run``), where torch has no static one.

Both raise where they cannot serve a kernel (the caller keeps the JIT call), and both give way to the JIT while a
Triton launch hook is set (:data:`HOOKED`): a profiler's hook still gets its call.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import textwrap
from collections.abc import Callable

import torch

__all__ = ["HOOKED", "direct_launcher", "static_launcher"]


def static_launcher(compiled, grid: int, n_tensors: int, device: torch.device, get_stream=None):
    """``launch(*tensors)`` through torch's static launcher, the one Inductor uses (``StaticallyLaunchedCudaKernel``:
    the cubin loaded once, each launch one C++ call that reads the tensors' pointers itself; no Python-level argument
    packing, no per-pointer driver query as in Triton's launcher). CUDA only; raises where this torch has none or
    the kernel needs what it does not support (launch hooks, scratch memory, several CTAs)."""
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:  # torch <= 2.11 named the module after CUDA
        from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel

    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(compiled.asm["cubin"])
        compiled._cubin_path = path  # where the static launcher reads the binary (Inductor sets the same attribute)
        kernel = StaticallyLaunchedCudaKernel(compiled)
        if len(kernel.arg_tys) != n_tensors or set(kernel.arg_tys) != {"O"}:
            raise TypeError(f"the kernel takes {kernel.arg_tys!r}, not {n_tensors} pointers")
        index, get_stream, runtime = _launch_context(device, get_stream)
        kernel.load_kernel(index)
    finally:
        os.unlink(path)
    run, raw = kernel.run, _raw_launch(kernel, grid)
    enter, entering, leave, leaving = _hooks_now(runtime)

    def launch(*tensors: torch.Tensor) -> None:
        if runtime.launch_enter_hook is not enter or runtime.launch_exit_hook is not leave or entering or leaving:
            _refuse_hooked(runtime)  # a hook set, or the hooks replaced: raises where one would be called
        if raw is not None:
            raw(tensors, get_stream(index))
        else:
            run(grid, 1, 1, get_stream(index), *tensors)

    launch.kernel, launch.raw = kernel, raw is not None  # the kernel: keeps the loaded module alive
    return launch


# what _raw_launch reads (has_scratch: torch 2.11's loop variable over the two scratch flags)
_RUN_FLAGS = {"_has_tensordesc", "is_rocm", "has_global_scratch", "has_profile_scratch", "has_scratch"}


def _code_names(source: str) -> set[str]:
    """The names a function's code uses: comments and strings left out (torch 2.11's run() explains ``has_*_scratch``
    in a comment), each attribute of a dotted name on its own."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return set(re.findall(r"[A-Za-z_]+", source))  # unreadable: every word counts (any flag keeps run())
    return {t.string for t in tokens if t.type == tokenize.NAME}


def _raw_launch(kernel, grid: int) -> Callable | None:
    """``raw(tensors, stream)``: the C++ launch that ``StaticallyLaunchedCudaKernel.run`` ends in, with what run()
    decides per call (the function, the scratch arguments, the argument types) decided once: ~2 µs less Python per
    launch. None wherever this torch's run() does anything else (tensor descriptors, ROCm, device-agnostic kernels,
    sized scratch memory): read off its source, so a torch that changes run() keeps run()."""
    import inspect

    try:
        source = inspect.getsource(type(kernel).run)
    except (OSError, TypeError):
        return None
    words = _code_names(source)
    unknown = {w for w in words if w.startswith(("has_", "_has_", "is_"))} - _RUN_FLAGS
    function, c_launch = (
        getattr(kernel, "function", None),
        getattr(getattr(kernel, "C_impl", None), "_launch_kernel", None),
    )
    if "_launch_kernel" not in words or unknown:
        return None
    if function is None or c_launch is None or getattr(kernel, "_has_tensordesc", False):
        return None
    if getattr(kernel, "device_agnostic", False) or getattr(kernel, "global_scratch_size", 0) or torch.version.hip:
        return None
    tys, tail = kernel.arg_tys, ()
    for flag in ("has_global_scratch", "has_profile_scratch"):
        if flag in words and getattr(kernel, flag, False):
            tys, tail = tys + "O", (*tail, None)
    warps, shared = kernel.num_warps, kernel.shared

    def raw(tensors: tuple, stream: int) -> None:
        c_launch(function, grid, 1, 1, warps, shared, tys, (*tensors, *tail), stream)

    return raw


def direct_launcher(
    fn, compiled, grid: int, n_tensors: int, constexprs: dict[str, int], device: torch.device, get_stream=None
):
    """``launch(*tensors)``: the compiled kernel's own launcher, skipping the JIT's dispatch (CUDA only).

    ``compiled`` is what ``fn[grid](...)`` returned (Triton's ``CompiledKernel``). Its launcher takes every bound
    argument of the JIT function in order, constexprs included (they are ignored), after the grid, stream,
    function handle and metadata. A profiling hook (``triton.knobs.runtime.launch_enter_hook``) set later still
    gets its call: with a hook set, the launch goes through the JIT.
    """
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    names = list(fn.arg_names)
    tail = [constexprs[name] for name in names[n_tensors:]]  # KeyError: a parameter we do not pass: no fast path
    if len(names) != n_tensors + len(tail):
        raise TypeError(f"{fn.arg_names} is not (tensors..., constexprs...)")
    if not _launcher_takes_constexprs(type(fn)):  # Triton 3.2-3.3 passed the non-constexpr arguments only
        tail = []
    index, get_stream, runtime = _launch_context(device, get_stream)
    enter, entering, leave, leaving = _hooks_now(runtime)

    def launch(*tensors: torch.Tensor) -> None:
        if runtime.launch_enter_hook is not enter or runtime.launch_exit_hook is not leave or entering or leaving:
            _refuse_hooked(runtime)  # a hook set, or the hooks replaced: raises where one would be called
        run(grid, 1, 1, get_stream(index), function, packed, None, None, None, *tensors, *tail)

    return launch


HOOKED = "a Triton launch hook is set: the JIT call gives it its metadata"


def _launch_context(device: torch.device, get_stream=None) -> tuple[int, Callable[[int], int], object]:
    """What a direct launch reads per call: the device index, ``get_stream(index)`` -> the current raw stream (an int),
    and Triton's runtime knobs (whose launch hooks a direct launch must not skip)."""
    from triton import knobs

    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, get_stream or torch._C._cuda_getCurrentRawStream, knobs.runtime


@functools.cache
def _launcher_takes_constexprs(jit_class: type) -> bool:
    """Does this Triton's ``JITFunction.run`` hand the compiled launcher every bound argument, constexprs included
    (3.4 and later: ``*bound_args.values()``), or only the others (``*non_constexpr_vals``)? Read from its source."""
    import inspect

    return "non_constexpr_vals" not in inspect.getsource(jit_class.run)


def _hook_calls(hook) -> list | tuple:
    """What a launch would call for one of Triton's launch hooks: empty where it calls nothing. Triton 3.6 and 3.9
    keep a ``HookChain`` that is never None, whose ``calls`` list ``add`` and ``remove`` change in place; an older
    Triton keeps a function or None; a user may assign either (a plain function: always "set")."""
    if hook is None:
        return ()
    chain = getattr(hook, "calls", None)
    return chain if isinstance(chain, list) else [hook]


def _hooks_now(runtime) -> tuple:
    """``(enter, entering, exit, leaving)``: Triton's launch hooks as a launcher is made, and for each what it calls
    (:func:`_hook_calls`, a list a chain changes in place). A launch compares them without a call: the same hook
    objects and both lists empty is "no hook". Both launchers write the comparison out in their launch: a function
    for it would cost the call it saves."""
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return enter, _hook_calls(enter), leave, _hook_calls(leave)


def _refuse_hooked(runtime) -> None:
    """Raise :data:`HOOKED` where a launch hook is really set (the caller gives the launch to the JIT)."""
    if _hook_calls(runtime.launch_enter_hook) or _hook_calls(runtime.launch_exit_hook):
        raise RuntimeError(HOOKED)
