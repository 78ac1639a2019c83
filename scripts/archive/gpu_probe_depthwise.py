"""What a depthwise convolution as a window sum costs on the GPU, per MobileNetV2 layer shape (issue 23, pass
``depthwise``). The stage is MobileNet's: BN -> ReLU6 -> depthwise 3x3 -> BN -> ReLU6 on the expansion conv's output,
bf16 channels_last, batch 32, compiled with ``backend="fusion"`` (inference). Variants, GPU kernel time per call
(torch.profiler, the sum of every CUDA kernel of 20 calls / 20):

* ``cudnn``: pass ``depthwise`` off: cuDNN's depthwise convolution between two generated kernels;
* ``window``: the window sum with the BN+ReLU6 before it computed again at each tap (the default), at several
  XBLOCK x num_warps (the default: ``triton_lang.WINDOW_BLOCK`` x 4; the first run, part aq2, had 1024 x 4 as its
  default and chose 512 from these rows);
* ``window, stored``: the BN+ReLU6 before the window in a kernel of its own, stored, read by the window kernel.

Part aq3 ran a version that walked tiles of XBLOCK pixels x RBLOCK channels instead of one flat index (each pixel's
window masks and each channel's weights computed once per tile); it was slower than the flat walk wherever the
channels are not a power of two (the tile's row is padded to one) and no faster elsewhere, and was removed: its rows
stay in ``scripts/results/h200-2026-11-25-aq3-probe_depthwise.json``.

    PYTHONPATH=. python3 scripts/archive/gpu_probe_depthwise.py          (on the lent GPU)
    python3 scripts/archive/gpu_probe_depthwise.py --dry-run              (CPU, tiny shapes: rehearse it)
"""

from __future__ import annotations

import json
import os
import sys
import time
from unittest import mock

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from fusion import backend
from fusion.ir import plan as ir
from fusion.kernels import triton_blocks

# (channels, height = width, stride) of MobileNetV2's depthwise stages (batch 32, 224x224 input)
SHAPES = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (192, 28, 1), (384, 14, 1), (960, 7, 1)]
CONFIGS = [None, (1024, 4), (256, 4), (1024, 8), (512, 2)]  # (XBLOCK, num_warps); None: the backend's choice


def stage(c: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.BatchNorm2d(c), nn.ReLU6(), nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU6()
    ).eval()  # fmt: skip


def gpu_us(fn, n: int) -> float:
    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        if cuda:
            torch.cuda.synchronize()
    if not cuda:
        return 0.0
    return sum(e.device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA) / n


def stored_before_window(writer, node, x):
    """The variant ``window, stored``: any value the window reads that this kernel computes is split off."""
    if x in writer.members:
        raise ir.SplitRegion(f"{node.name}: its input stored by a kernel of its own (probe)", node, [x])


def measure(c: int, hw: int, stride: int, variant: str, config, device, dtype, batch: int, n: int) -> dict:
    torch.manual_seed(0)
    model = stage(c, stride).to(device, dtype).to(memory_format=torch.channels_last)
    x = torch.randn(batch, c, hw, hw, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    real_plan = ir.KernelPlan.launch_config

    def launch_config(plan, dev):
        programs, constexprs = real_plan(plan, dev)
        if (
            config is None
            or dev.type != "cuda"
            or not plan.xnumel
            or not any("depthwise" in op for op in plan.kernel.ops)
        ):
            return programs, constexprs
        return -(-plan.xnumel // config[0]), {"XBLOCK": config[0]}

    real_init = ir.KernelPlan.__init__

    def init(plan, *args, **kwargs):
        real_init(plan, *args, **kwargs)
        if config is not None and any("depthwise" in op for op in plan.kernel.ops):
            plan.num_warps = config[1]

    patches = [mock.patch.object(ir.KernelPlan, "launch_config", launch_config),
               mock.patch.object(ir.KernelPlan, "__init__", init)]  # fmt: skip
    if variant == "window, stored":
        patches.append(mock.patch.object(triton_blocks, "_one_window_deep", stored_before_window))
    options = {"depthwise": False} if variant == "cudnn" else {}
    backend.reset()
    with contextlib_exit(patches), torch.no_grad():
        fn = torch.compile(model, backend="fusion", options=options)
        want = model(x)
        got = fn(x)
        err = (got.float() - want.float()).abs().max().item()
        for _ in range(3):
            fn(x)
        us = gpu_us(lambda: fn(x), n)
    part = backend.reports[0].part("inference")
    return {"c": c, "hw": hw, "stride": stride, "variant": variant, "config": config,
            "gpu_us": round(us, 1), "kernels": len(part.kernels), "library_calls": dict(part.library_calls),
            "max_abs_err_vs_eager": err}  # fmt: skip


class contextlib_exit:
    def __init__(self, patches):
        self.patches = patches

    def __enter__(self):
        for p in self.patches:
            p.__enter__()

    def __exit__(self, *exc):
        for p in reversed(self.patches):
            p.__exit__(*exc)


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    batch, n = (1, 2) if dry else (32, 20)
    shapes = [(16, 9, 1), (16, 9, 2)] if dry else SHAPES
    rows = []
    t0 = time.time()
    for c, hw, stride in shapes:
        variants = (("cudnn", [None]), ("window", CONFIGS), ("window, stored", [None]))
        for variant, configs in variants:
            for config in configs:
                row = measure(c, hw, stride, variant, config, device, dtype, batch, n)
                rows.append(row)
                print(f"C={c:4d} {hw:3d}x{hw:<3d} s{stride} {variant:15s} {str(config or 'default'):11s}: "
                      f"{row['gpu_us']:8.1f} µs GPU, {row['kernels']} kernels, calls {row['library_calls']}, "
                      f"err {row['max_abs_err_vs_eager']:.3g}  [{time.time() - t0:.0f} s]", flush=True)  # fmt: skip
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe_depthwise.json"), "w") as f:
            meta = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                    "device": torch.cuda.get_device_name() if not dry else "cpu"}  # fmt: skip
            json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
