"""Bounds checks for kernels run in Triton's CPU interpreter: every lane a load or store lets through must address
an element of one of the launch's tensors. Machinery: the runtime (``triton_runtime._Interpreted``) wraps every
interpreted launch in :func:`launch`; a learner reads ``fusion/codegen.py``.

Why: the interpreter executes ``tl.load``/``tl.store`` as raw reads and writes of host memory. A load without a mask
reads past the tensor's end and its tail lanes are thrown away by a masked store, so the outputs are bit-equal and no
comparison with eager can see the mistake; a store at a wrong offset (an index split without ``% size``) writes over
whatever lies there, and Python dies (``Fatal Python error: Aborted``, a segfault) before any test can report. Here
each access is checked *before* the interpreter performs it, and a wrong one raises :class:`OutOfBounds`, naming the
kernel, its line, the tensor, the offending lanes and the likely mistake.

The check patches the interpreter's builder (``create_load``/``create_store`` and their masked forms) once; it is
active only inside :func:`launch`, so anything else the interpreter runs is left alone. ``FUSION_BOUNDS_CHECK=0``
turns it off.

The interpreter's other differences from a GPU are mended here too: :func:`exact_bfloat16_in_the_interpreter`
(float32 <-> bfloat16 rounded as a GPU rounds) and :func:`device_asserts` (a kernel's ``tl.device_assert``s, its
indexed reads' range checks, run as the GPU runs them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import os
import sys
import threading
from dataclasses import dataclass

import torch

from fusion.ir.views import extent
from fusion.kernels import c_runtime

__all__ = ["OutOfBounds", "device_asserts", "exact_bfloat16_in_the_interpreter", "install", "launch"]


class OutOfBounds(IndexError):
    """A load or store of a kernel in Triton's interpreter would touch memory outside every tensor of its launch."""


@dataclass(frozen=True)
class _Buffer:
    name: str  # the kernel's parameter: in_ptr0, out_ptr1
    start: int  # address of the tensor's first element
    end: int  # one past the address of its last element
    itemsize: int
    shape: tuple[int, ...]
    dtype: torch.dtype


_state = threading.local()  # .launch: (kernel name, [_Buffer]) while a checked launch runs; .quiet: inside create_load


def _buffers(arg_names: list[str], args: tuple) -> list[_Buffer]:
    out = []
    for name, t in zip(arg_names, args, strict=False):
        if isinstance(t, torch.Tensor) and t.numel() > 0:
            start, size = t.data_ptr(), extent(t.shape, t.stride()) * t.element_size()
            out.append(_Buffer(name, start, start + size, t.element_size(), tuple(t.shape), t.dtype))
    return out


def install() -> bool:
    """Patch the interpreter's builder so that loads and stores are checked inside :func:`launch`; True once done
    (False where this Triton has no interpreter builder of the expected shape: nothing is checked)."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    names = ("create_load", "create_store", "create_masked_load", "create_masked_store")
    if builder is None or not all(hasattr(builder, f) for f in names):
        return False
    if getattr(builder, "_fusion_bounds_check", False):
        return True
    load, store = builder.create_load, builder.create_store
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store

    def unmasked(original, what):
        def run(self, ptr, *rest):
            _check(np, ptr, None, what)
            _state.quiet = True  # the original calls the masked form with a mask of ones: checked already
            try:
                return original(self, ptr, *rest)
            finally:
                _state.quiet = False

        return run

    def create_masked_load(self, ptrs, mask, *rest):
        _check(np, ptrs, mask, "load")
        return masked_load(self, ptrs, mask, *rest)

    def create_masked_store(self, ptrs, value, mask, *rest):
        _check(np, ptrs, mask, "store")
        return masked_store(self, ptrs, value, mask, *rest)

    builder.create_load, builder.create_store = unmasked(load, "load"), unmasked(store, "store")
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder._fusion_bounds_check = True
    return True


@contextlib.contextmanager
def launch(fn, args: tuple):
    """Check every load and store of one interpreted launch of ``fn`` (a ``@triton.jit`` function) on ``args``.
    An :class:`OutOfBounds` raised inside is re-raised as itself (the interpreter wraps it in an InterpreterError)."""
    if os.environ.get("FUSION_BOUNDS_CHECK", "1") == "0" or not install():
        yield
        return
    arg_names = list(getattr(fn, "arg_names", None) or [])
    name = getattr(getattr(fn, "fn", fn), "__name__", "kernel")
    previous = getattr(_state, "launch", None)
    _state.launch = (name, _buffers(arg_names, args))
    try:
        yield
    except Exception as e:
        cause = e
        while cause is not None and not isinstance(cause, OutOfBounds):
            cause = cause.__cause__ or cause.__context__
        if cause is None or cause is e:
            raise
        raise cause.with_traceback(None) from None
    finally:
        _state.launch = previous


def _check(np, ptrs, mask, what: str) -> None:
    current = getattr(_state, "launch", None)
    if current is None or getattr(_state, "quiet", False):
        return
    kernel, buffers = current
    addr = np.asarray(ptrs.data).astype(np.int64).ravel()
    active = np.ones(addr.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask.data), ptrs.data.shape)
    active = active.ravel().astype(bool)
    lanes = np.flatnonzero(active)
    if lanes.size == 0 or not buffers:
        return
    used = addr[lanes]
    inside = [((used >= b.start) & (used < b.end)) for b in buffers]
    if any(ins.all() for ins in inside):
        return
    # The tensor this access meant: the one holding most of its lanes, else the nearest one below its lowest address.
    best = max(range(len(buffers)), key=lambda i: (inside[i].sum(), -abs(int(used.min()) - buffers[i].start)))
    buf, ok = buffers[best], inside[best]
    raise OutOfBounds(_message(kernel, what, buf, used, lanes, ok, masked=mask is not None))


def _kernel_line(kernel: str) -> str:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != kernel:
        frame = frame.f_back
    if frame is None:
        return kernel
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{kernel} ({frame.f_code.co_filename}:{frame.f_lineno}): `{text}`"


def _message(kernel, what, buf: _Buffer, used, lanes, ok, masked: bool) -> str:
    offsets = (used - buf.start) // buf.itemsize
    numel = (buf.end - buf.start) // buf.itemsize
    bad = ~ok
    first = int(lanes[bad][0])
    head = (
        f"{_kernel_line(kernel)}\n  a {what} of {buf.name} ({tuple(buf.shape)} {buf.dtype}, elements 0..{numel - 1}) "
        f"at element offsets {int(offsets.min())}..{int(offsets.max())}: {int(bad.sum())} of {lanes.size} lanes "
        f"outside it (the first: lane {first}, offset {int(offsets[bad][0])})."
    )
    if not masked:
        why = (
            f"This tl.{what} has no mask: the lanes past the tensor's end (the last block's tail, xindex >= numel; "
            f"rindex >= the row length) must be masked: tl.{what}(pointer, {'value, ' if what == 'store' else ''}mask)."
        )
    else:
        why = (
            "Its mask lets these lanes through, so their offsets are wrong: check each dimension's index (split_index: "
            "outermost first, every dimension but the outermost taken % its size), the broadcasting of size-1 dims "
            "(broadcast_index reads them at 0) and the strides."
        )
    return f"{head}\n  {why}\n  (Stopped before the interpreter {what}s there: a stray write, even a read, can crash Python.)"


def exact_bfloat16_in_the_interpreter() -> bool:
    """Make Triton's interpreter convert float32 <-> bfloat16 as a GPU does; True once it does.

    A GPU's ``.to(tl.bfloat16)`` rounds to nearest even in one instruction; the interpreter's numpy version
    (``triton/runtime/interpreter.py``, ``_convert_float``) truncates instead, and gets subnormals wrong both ways
    (seen with Triton 3.9: 0x002B0000 stored as bfloat16 0x002C). Generated kernels round to bfloat16 with
    ``.to(tl.bfloat16).to(tl.float32)``, as Inductor's do, so CPU runs would disagree with the GPU and with torch. The
    two conversions are replaced by exact bit arithmetic (every other cast stays Triton's): bfloat16 is the upper half
    of a float32, and rounding adds 0x7FFF plus the lowest kept bit before cutting the lower half; NaN stays NaN."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder, handle = getattr(interpreter, "InterpreterBuilder", None), getattr(interpreter, "TensorHandle", None)
    if handle is None or not all(hasattr(builder, f) for f in ("cast_impl", "create_fp_to_fp")):
        return False  # another Triton: its own conversions stay
    if getattr(builder, "_fusion_exact_bfloat16", False):
        return True

    def convert(data, dst):
        if dst == tl.float32:  # bfloat16 (held as uint16) -> float32: the bits, shifted up
            return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        bits = data.astype(np.float32).view(np.uint32).astype(np.uint64)
        kept = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(np.isnan(data), np.uint16(0x7FC0), kept)

    def exact(original):
        def cast(self, src, dst_type, *rest):
            pair = (src.dtype.scalar, dst_type.scalar)
            if pair in ((tl.float32, tl.bfloat16), (tl.bfloat16, tl.float32)):
                return handle(convert(np.asarray(src.data), pair[1]), pair[1])
            return original(self, src, dst_type, *rest)

        return cast

    builder.cast_impl = exact(builder.cast_impl)
    builder.create_fp_to_fp = exact(builder.create_fp_to_fp)
    builder._fusion_exact_bfloat16 = True
    return True


@contextlib.contextmanager
def device_asserts(fn):
    """Run the ``tl.device_assert``s of a kernel defined with ``debug=True`` (its indexed reads' range checks) in the
    interpreter, which skips them otherwise (its builder's options say ``debug=False``); an index out of range
    raises ``IndexError`` as the C kernel and eager do."""
    if not (getattr(fn, "debug", None) or getattr(fn, "kwargs", {}).get("debug")):  # JITFunction, InterpretedFunction
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    options = builder.options
    builder.options = dataclasses.replace(options, debug=True, sanitize_overflow=False)  # tlang.OPTIONS
    try:
        yield
    except Exception as e:
        cause = e
        while cause is not None and "index out of range" not in str(cause):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise IndexError(c_runtime.index_error(getattr(getattr(fn, "fn", fn), "__name__", "kernel"))) from None
    finally:
        builder.options = options
