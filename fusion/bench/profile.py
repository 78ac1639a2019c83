"""Measuring the machine: its peaks (a copy and a matmul), what the GPU did per call (torch.profiler), and the
bytes a CPU call allocates (a dispatch mode that logs every allocation and free).

Plumbing for Phase 4's lesson (``fusion.benchmark``): the lesson's timing loop measures the peaks; these functions
feed it the probes and read the profiler. Nothing here imports the lesson.
"""

from __future__ import annotations

import platform
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


def sync_for(device: str) -> Callable[[], None]:
    """What the timing loop calls to wait for the device: CUDA runs kernels asynchronously; a CPU call is done when
    it returns."""
    return torch.cuda.synchronize if device == "cuda" else _no_sync


def _no_sync() -> None:
    pass


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ----------------------------------------------------------------------------------------------------------------------
# The machine's peaks


@dataclass(frozen=True)
class Peaks:
    flops_per_s: float  # best observed matmul throughput, in the workloads' dtype
    bytes_per_s: float  # best observed copy throughput, bytes read + bytes written
    copy_bytes: int = 0
    matmul_n: int = 0
    dtype: str = ""
    copy_times_s: tuple[float, ...] = ()
    matmul_times_s: tuple[float, ...] = ()

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where the two ceilings meet."""
        return self.flops_per_s / self.bytes_per_s


PEAK_ROUNDS = 5  # interleaved rounds of the probes: a ceiling is the best the machine does, and needs a few tries


def measure_peaks(
    time_variants: Callable[..., dict],
    *,
    device: str,
    dtype: torch.dtype,
    copy_numel: int,
    matmul_n: int,
    min_run_time: float,
    threads: int,
    seed: int = 0,
) -> Peaks:
    """This machine's ceilings: bandwidth from a large copy (bytes read + written), compute from a large matmul.

    Timed with the lesson's ``time_variants`` (warm-up, several interleaved rounds); the best block wins, because a
    ceiling is what the machine *can* do: a slow block is a neighbour or a clock ramping up, not the machine.
    """
    dev = torch.device(device)
    src = torch.ones(copy_numel, dtype=dtype, device=dev)  # touch every page before timing
    dst = torch.empty_like(src).fill_(0)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(matmul_n, matmul_n, generator=g).to(dev, dtype)
    b = torch.randn(matmul_n, matmul_n, generator=g).to(dev, dtype)
    c = torch.empty(matmul_n, matmul_n, dtype=dtype, device=dev)
    fns = {"copy": lambda: dst.copy_(src), "matmul": lambda: torch.mm(a, b, out=c)}
    timings = time_variants(
        fns, rounds=PEAK_ROUNDS, min_run_time=min_run_time, warmup=3, sync=sync_for(device), threads=threads
    )
    copy_bytes = 2 * src.numel() * src.element_size()
    copy_times, matmul_times = timings["copy"].times_s, timings["matmul"].times_s
    return Peaks(
        flops_per_s=2 * matmul_n**3 / min(matmul_times),
        bytes_per_s=copy_bytes / min(copy_times),
        copy_bytes=copy_bytes,
        matmul_n=matmul_n,
        dtype=str(dtype).removeprefix("torch."),
        copy_times_s=tuple(copy_times),
        matmul_times_s=tuple(matmul_times),
    )


# ----------------------------------------------------------------------------------------------------------------------
# Bytes allocated on CPU: torch keeps allocator statistics for CUDA only, so on CPU we log every allocation


class AllocationLog(TorchDispatchMode):
    """Inside ``with AllocationLog() as log:``, every op that returns a tensor with new storage appends ``+nbytes``
    to ``log.events``, and ``-nbytes`` when that tensor is freed. Views and in-place results (storage shared with an
    input) allocate nothing. The running sum of the events is the bytes alive; its maximum is the peak.

    It sees what goes through the dispatcher: eager ops, our FX passes. Code compiled by torch.compile allocates its
    buffers below it (the harness does not ask it about those).
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {_storage_ptr(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or _storage_ptr(t) in seen:
                continue
            seen.add(_storage_ptr(t))
            n = t.untyped_storage().nbytes()
            if n:
                self.events.append(n)
                weakref.finalize(t, self.events.append, -n)
        return out


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, some subclasses)
        return id(t)


# ----------------------------------------------------------------------------------------------------------------------
# What the GPU did per call


def event_device_us(e: object) -> float:
    """A profiler event's time on the device, in µs. Attribute names differ across torch versions."""
    rng = getattr(e, "time_range", None)
    if rng is not None and hasattr(rng, "elapsed_us"):
        return float(rng.elapsed_us())
    for attr in ("device_time_total", "cuda_time_total", "self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, attr):
            return float(getattr(e, attr))
    return 0.0


MAX_NAMES = 300  # kernel names kept per variant in the JSON (a ResNet launches ~100 distinct ones)


def gpu_profile(fn: Callable[[], object], calls: int = 20, top: int = 4) -> dict:
    """What the GPU did during ``calls`` calls of ``fn`` (torch.profiler, CUDA activity): per call, the sum of the
    kernel times, the number of kernels, the ``top`` kernels by time, and every kernel's µs per call by name
    (``by_name``: Triton kernels appear under their function's name, which is how generated kernels are matched).

    Wall time per call minus GPU time per call is time the GPU sat idle, waiting for the CPU (Python, dispatch,
    kernel launch): with asynchronous launches a call costs max(CPU time, GPU time), so a gap means the CPU sets the
    pace — overhead, not bytes. A profiler that fails returns ``{"error": ...}``.
    """
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle": one cycle here
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
        device_types = {torch.autograd.DeviceType.CUDA}
        kernels = [e for e in prof.events() if getattr(e, "device_type", None) in device_types]
    except Exception as e:  # a profiler that does not work here must not cost the timings
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(event_device_us(e))
    total_us = sum(sum(ts) for ts in by_name.values())
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    return {
        "calls": calls,
        "gpu_s": total_us / calls / 1e6,
        "kernels_per_call": len(kernels) / calls,
        "top": [
            {"name": name, "per_call": len(ts) / calls, "us_per_call": sum(ts) / calls, "share": sum(ts) / total_us}
            for name, ts in ranked[:top]
        ]
        if total_us
        else [],
        "by_name": {name: sum(ts) / calls for name, ts in ranked[:MAX_NAMES]},
    }
