"""Buffer reuse (``memory_plan.reuse_buffers``, CPU-only) tried on CUDA, in one process per model: ``fusion`` as it
is against ``fusion`` whose generated kernels write into buffers the graph is done with (of any size), and Inductor.

    PYTHONPATH=. python3 scripts/gpu_ab_reuse_cuda.py t5_encoder_train,llama_train   (on the lent GPU)
    python3 scripts/gpu_ab_reuse_cuda.py --dry-run gpt2_train                        (CPU, tiny shapes: rehearse it)

A CUDA training step is CPU-bound, and ours allocates more buffers a step than Inductor's wrapper, which reuses
freed ones (T5: 539 ``empty_strided`` calls a step against 380). The reused buffer is viewed with the output's
strides through Inductor's ``reinterpret_tensor`` (``as_strided`` costs about what an allocation does). Per variant:
milliseconds a step (the suite's interleaved timer, synchronised), the CPU time of a step alone (not synchronised),
how many kernel outputs reuse a buffer (forward and backward graphs). An experiment: the values are the plan's, tested
on CPU; CUDA streams other than the current one are not considered. Raw JSON to $OUT/ab_reuse_cuda.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
from gpu_ab import warm_step

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.aten.nodes import reinterpret
from fusion.bench.suite import MODELS, SuiteConfig
from fusion.compiler import memory_plan
from fusion.kernels import triton_runtime


def _fast_into(buffer, shape, stride, dtype, alloc, need=0):
    if buffer.dtype is dtype and buffer.storage_offset() == 0:  # the plan sized it: no bounds check
        return reinterpret(buffer, tuple(shape), tuple(stride), 0)
    return alloc(shape, stride, dtype)


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")]
    names = names[0].split(",") if names else ["t5_encoder_train"]
    cfg = SuiteConfig("cpu" if dry else "cuda", "tiny" if dry else "full")
    sync = (lambda: None) if dry else torch.cuda.synchronize
    plain_devices, plain_min, plain_into = memory_plan.DEVICES, memory_plan.REUSE_MIN, triton_runtime._into
    rows = []
    for name in names:
        spec = MODELS[name]
        calls, reused, seen = {}, {}, len(backend.reports)
        for label, which, devices in (("fusion", "fusion", plain_devices), ("fusion_reuse", "fusion", ("cpu", "cuda")),
                                      ("inductor", "inductor", plain_devices)):  # fmt: skip
            torch._dynamo.reset()
            memory_plan.DEVICES = devices
            memory_plan.REUSE_MIN = 0 if label == "fusion_reuse" else plain_min
            try:
                calls[label] = warm_step(spec, cfg, which, sync)
            finally:
                memory_plan.DEVICES, memory_plan.REUSE_MIN = plain_devices, plain_min
            if which == "fusion":
                launchers = [lch for r in backend.reports[seen:] for p in r.parts for lch in p.launchers()]
                reused[label] = sum(len(lch.donated) for lch in launchers)
            seen = len(backend.reports)
        triton_runtime._into = _fast_into
        from torch.utils.benchmark import Timer

        times, cpu = {k: [] for k in calls}, {k: [] for k in calls}
        for _ in range(3 if dry else 15):
            for label, fn in calls.items():
                sync()
                m = Timer("fn(); sync()", globals={"fn": fn, "sync": sync}).blocked_autorange(
                    min_run_time=0.05 if dry else 0.3
                )
                times[label].append(m.median)
                sync()
                t0 = time.perf_counter()
                fn()
                cpu[label].append(time.perf_counter() - t0)
                sync()
        triton_runtime._into = plain_into
        row = {"model": name, "device": "cpu" if dry else torch.cuda.get_device_name(), "torch": torch.__version__}
        for label in calls:
            row[label] = {"ms": statistics.median(times[label]) * 1e3, "cpu_ms": statistics.median(cpu[label]) * 1e3}
        row["reused_outputs"] = reused
        base = row["inductor"]["ms"]
        print(name, "  ".join(f"{k} {row[k]['ms']:.2f} ms ({base / row[k]['ms']:.3f} of Inductor; CPU "
                              f"{row[k]['cpu_ms']:.2f} ms)" for k in calls), "reused outputs", reused, flush=True)  # fmt: skip
        rows.append(row)
        del calls
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "ab_reuse_cuda.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
