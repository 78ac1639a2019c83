"""What a profiler trace says about overlap: GPU kernels as two lanes, communication and compute.

``torch.profiler``'s Chrome trace (``prof.export_chrome_trace(path)``, viewable in Perfetto or chrome://tracing) lists
every GPU kernel as an event ``{"ph": "X", "cat": "kernel", "name": ..., "ts": µs, "dur": µs}``. NCCL's kernels
(``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, ...) are the communication lane; every other kernel is compute, and
so are the copies and memsets on a compute stream (``"cat": "gpu_memcpy"`` / ``"gpu_memset"``): eager funcol's
``all_reduce`` copies its input with a ``cudaMemcpyAsync`` (``Memcpy DtoD``, 128 MiB in 63 µs on an H200), where
Inductor emits the same copy as a Triton kernel. Counting only kernels charged every such copy that ran beside a
collective as exposed time (issue 40: ~0.1 ms per gradient of the data-parallel step, 0.5 ms a step at 2 GPUs).
A collective's time is *exposed* where no compute runs beside it: the GPU waits for the network then.

>>> t = Lanes([("mm", 0.0, 10.0), ("add", 12.0, 14.0)], [("ncclDevKernel_AllReduce", 5.0, 13.0)])
>>> round(t.exposed_us(), 1), round(t.comm_us(), 1)
(2.0, 8.0)

Everything here reads a trace file (``.json`` or ``.json.gz``) or the lists themselves: it runs on a CPU, so the
plot of a kept GPU trace (:mod:`fusion.comms.plot`) and the tests need no GPU.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

Span = tuple[str, float, float]  # (kernel name, start µs, end µs)


def is_comm_kernel(name: str) -> bool:
    return "nccl" in name.lower()


def short_kernel(name: str) -> str:
    """``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<...>)`` -> ``AllReduce_Sum_bf16_RING_LL``;
    a long C++ kernel name -> its first 40 characters without the template arguments."""
    base = name.split("(")[0].split("<")[0].strip()
    return base.removeprefix("ncclDevKernel_").removeprefix("ncclKernel_")[:40] or name[:40]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


@dataclass
class Lanes:
    """The GPU's kernels of one traced step: compute and communication, each (name, start µs, end µs)."""

    compute: list[Span]
    comm: list[Span]
    notes: list[str] = field(default_factory=list)

    def comm_us(self) -> float:
        return sum(e - s for _, s, e in self.comm)

    def hidden_us(self, span: Span) -> float:
        """Of one communication kernel, the µs some compute kernel runs beside it."""
        _, s, e = span
        return sum(max(0.0, min(e, b) - max(s, a)) for a, b in _union([(a, b) for _, a, b in self.compute]))

    def exposed_us(self) -> float:
        return sum((e - s) - self.hidden_us((n, s, e)) for n, s, e in self.comm)

    def window_us(self) -> float:
        spans = self.compute + self.comm
        return max(e for _, _, e in spans) - min(s for _, s, _ in spans) if spans else 0.0

    def detail(self, top: int = 3) -> list[dict]:
        """Per communication kernel, in start order: when (from the first kernel), how long, how much compute hid it,
        and the compute kernels that did (most overlap first): which collective waited, and what should have hidden it."""
        t0 = min((s for _, s, _ in self.compute + self.comm), default=0.0)
        out = []
        for name, s, e in sorted(self.comm, key=lambda x: x[1]):
            by: dict[str, float] = {}
            for cname, a, b in self.compute:
                overlap = min(e, b) - max(s, a)
                if overlap > 0:
                    by[short_kernel(cname)] = by.get(short_kernel(cname), 0.0) + overlap
            hidden = self.hidden_us((name, s, e))
            out.append({"kernel": short_kernel(name), "start_us": round(s - t0, 2), "dur_us": round(e - s, 2),
                        "hidden_us": round(hidden, 2), "exposed_us": round(e - s - hidden, 2),
                        "hidden_by": [k for k, _ in sorted(by.items(), key=lambda kv: -kv[1])[:top]]})  # fmt: skip
        return out

    def summary(self) -> dict:
        return {"comm_ms": self.comm_us() / 1e3, "exposed_ms": self.exposed_us() / 1e3,
                "gpu_window_ms": self.window_us() / 1e3, "nccl_kernels": len(self.comm),
                "compute_kernels": len(self.compute)}  # fmt: skip


GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def _stream(ev: dict) -> object:
    return ev.get("args", {}).get("stream", ev.get("tid"))


def read_trace(path: str | Path) -> dict:
    """A Chrome trace as torch.profiler writes it (``.json``, or gzipped ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def lanes_of_trace(trace: dict | str | Path, device: int | None = None) -> Lanes:
    """The kernels of a Chrome trace as :class:`Lanes` (``device``: only that GPU's, where the trace has several)."""
    if not isinstance(trace, dict):
        trace = read_trace(trace)
    compute: list[Span] = []
    comm: list[Span] = []
    events = [ev for ev in trace.get("traceEvents", []) if ev.get("ph") == "X" and "dur" in ev
              and ev.get("cat") in GPU_WORK and (device is None or ev.get("args", {}).get("device", device) == device)]  # fmt: skip
    nccl_streams = {_stream(ev) for ev in events if ev["cat"] == "kernel" and is_comm_kernel(ev.get("name", ""))}
    for ev in events:
        span = (ev.get("name", "?"), float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
        if ev["cat"] == "kernel":
            (comm if is_comm_kernel(span[0]) else compute).append(span)
        elif _stream(ev) not in nccl_streams:  # a copy or memset on a compute stream: the GPU is busy
            compute.append(span)
    notes = [] if compute or comm else ["no GPU kernels in this trace (a CPU run): nothing to overlap on a GPU"]
    return Lanes(sorted(compute, key=lambda x: x[1]), sorted(comm, key=lambda x: x[1]), notes)


def gzip_file(path: str | Path, remove: bool = True) -> Path:
    """``path`` -> ``path.gz`` (level 6); the original removed. Chrome traces shrink about tenfold."""
    path = Path(path)
    out = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    if remove:
        path.unlink()
    return out


def profile_call(fn, trace_path: str | Path | None, cuda: bool, compress: bool = True) -> Lanes:
    """Run ``fn()`` once under torch.profiler (CPU, and CUDA where ``cuda``), keep the trace at ``trace_path``
    (when given; gzipped to ``trace_path + '.gz'`` where ``compress``), and return its kernels as :class:`Lanes`."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    if trace_path is None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "trace.json")
            prof.export_chrome_trace(str(path))
            return lanes_of_trace(path)
    prof.export_chrome_trace(str(trace_path))
    lanes = lanes_of_trace(trace_path)
    if compress:
        gzip_file(trace_path)
    return lanes


def pack_traces(paths: list[Path], archive: str | Path) -> Path:
    """Every trace of ``paths`` into one ``archive`` (.tar.gz, each under its own name), the files removed: one file
    per world size comes back from a device run however many ranks and variants were traced."""
    import tarfile

    archive = Path(archive)
    with tarfile.open(archive, "w:gz") as tar:
        for p in sorted(paths):
            tar.add(p, arcname=Path(p).name)
    for p in paths:
        Path(p).unlink()
    return archive
