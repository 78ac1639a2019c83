"""A short CUDA check of Phase 4's cuDNN epilogue, GPU breakdown and overhead numbers (not the full benchmark).

    PYTHONPATH=. python3 scripts/gpu_check.py        (on the device machine; ~1 minute)

1. cuDNN's fused ops vs eager on ConvBNNet's shapes (stem 3→C, conv C→C, depthwise C→C + residual), bf16 and fp32,
   channels_last and NCHW, and with a NaN-poisoned allocator cache (the fused op passes its uninitialised output
   as ``z`` with alpha 0: a NaN there must not leak). 2. Which ATen backend each conv takes, and whether the bias is
   a separate kernel (profiler). 3. The two workloads that missed their targets, through the benchmark's own
   run_workload (cuda-quick sizes, no torch.compile): table, GPU breakdown, verdicts. 4. The Linear+ReLU hot path:
   wall vs GPU time of eager, gm(x), the raw op.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusion import benchmark as B
from fusion.bench import harness as H
from fusion.bench import report as R
from fusion.bench import workloads as W
from fusion.bench.accuracy import acceptable, relative_error
from fusion.bench.config import SIZES, Config
from fusion.bench.profile import gpu_profile, measure_peaks
from fusion.bench.rows import summarize
from fusion.conv_bn_fusion import CUDNN_EPILOGUE

t_start = time.time()
dev = "cuda"
print(
    f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
    f"{torch.cuda.get_device_name()}"
)
torch.backends.cudnn.benchmark = True
bad = []


# -- 1. the fused cuDNN ops against eager ----------------------------------------------------------------------------
print("\n== 1. torch.cudnn_convolution_relu / _add_relu vs eager (max |diff| / max |eager|)")
C, N, S = 128, 64, 56
shapes = {  # name: (in_ch, groups, with residual z)
    "stem 3->128": (3, 1, False),
    "conv 128->128": (C, 1, False),
    "depthwise 128 + z": (C, C, True),
}
g = torch.Generator().manual_seed(0)
for dtype in (torch.bfloat16, torch.float32):
    for cl in (True, False):
        for name, (cin, groups, with_z) in shapes.items():
            x = torch.randn(N, cin, S, S, generator=g).to(dev, dtype)
            w = (torch.randn(C, cin // groups, 3, 3, generator=g) * 0.2).to(dev, dtype)
            b = torch.randn(C, generator=g).to(dev, dtype)
            z = torch.randn(N, C, S, S, generator=g).to(dev, dtype)
            if cl:
                x, w, z = (t.contiguous(memory_format=torch.channels_last) for t in (x, w, z))
            args = ((1, 1), (1, 1), (1, 1), groups)
            ref = F.conv2d(x, w, b, 1, 1, 1, groups)
            ref = torch.relu(ref + z if with_z else ref)
            try:
                poison = torch.full((N, C, S, S), float("nan"), device=dev, dtype=dtype)  # NaN into the cache
                del poison
                if with_z:
                    got = torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, *args)
                else:
                    got = torch.cudnn_convolution_relu(x, w, b, *args)
                torch.cuda.synchronize()
                d = relative_error(got, ref)
                ref64 = F.conv2d(x.double(), w.double(), b.double(), 1, 1, 1, groups)
                ref64 = torch.relu(ref64 + z.double() if with_z else ref64)
                ok = bool(torch.isfinite(got).all()) and acceptable(got, ref, ref64)[0]
                print(
                    f"  {str(dtype)[6:]:<9} {'CL' if cl else 'NCHW':<4} {name:<18} rel diff {d:.2e} "
                    f"finite {bool(torch.isfinite(got).all())} {'ok' if ok else 'BAD'}"
                )
                if not ok:
                    bad.append(f"{dtype} {cl} {name}: {d}")
            except RuntimeError as e:
                print(
                    f"  {str(dtype)[6:]:<9} {'CL' if cl else 'NCHW':<4} {name:<18} RAISED {str(e).splitlines()[0][:150]}"
                )
                bad.append(f"{dtype} {cl} {name}: raised")

# -- 2. backend and bias kernel --------------------------------------------------------------------------------------
print("\n== 2. ATen's backend per conv and the kernels of a conv with bias (bf16, channels_last)")
x = torch.randn(N, C, S, S, device=dev, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
for name, conv in (
    ("conv 128->128 +bias", nn.Conv2d(C, C, 3, padding=1)),
    ("depthwise +bias", nn.Conv2d(C, C, 3, padding=1, groups=C)),
):
    conv = conv.to(dev, torch.bfloat16).to(memory_format=torch.channels_last).eval()
    backend = torch._C._select_conv_backend(
        x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, False, [0, 0], conv.groups
    )
    with torch.no_grad():
        prof = gpu_profile(lambda conv=conv: conv(x), calls=5)
    names = [f"{k['name'][:60]} ({k['us_per_call']:.1f} µs)" for k in prof["top"]]
    print(
        f"  {name:<20} backend {backend}: {prof['kernels_per_call']:.3g} kernels/call, "
        f"GPU {prof['gpu_s'] * 1e6:.1f} µs: {names}"
    )

# -- 3. the two workloads through run_workload -----------------------------------------------------------------------
print("\n== 3. run_workload (cuda-quick, no compile): linear_relu_memory and conv_bn_relu")
config = Config(device="cuda", sizes="cuda-quick", compile=False, threads=torch.get_num_threads())
result = {"meta": {"device": "cuda", "sizes": "cuda-quick"}, "workloads": []}
with torch.no_grad():
    s = SIZES[config.sizes]
    peaks = measure_peaks(
        B.time_variants,
        device="cuda",
        dtype=config.dtype,
        copy_numel=s.copy_numel,
        matmul_n=s.matmul_n,
        min_run_time=0.05,
        threads=config.threads,
    )
    result["peaks"] = dataclasses.asdict(peaks)
    print(f"  peaks {peaks.bytes_per_s / 1e9:.0f} GB/s, {peaks.flops_per_s / 1e12:.0f} TFLOP/s")
    for w in W.workloads(config):
        if w.key in ("linear_relu_memory", "conv_bn_relu"):
            result["workloads"].append(H.run_workload(w, config, peaks, config.threads, print, B.LESSON, s.rounds))
print(R.results_table(result))
print("\n".join(R.skipped_lines(result) + R.kernel_path_lines(result)))
print("\n".join(R.gpu_lines(result)))
print("\n".join(R.closing_note(result)))
for w in result["workloads"]:
    for v in w["variants"]:
        if v["outputs_match"] is False:
            bad.append(f"{w['key']}/{v['name']} mismatch {v['max_rel_diff']}")
        if v["name"] == "fx_epilogue":
            print(
                f"  fx_epilogue kernel paths: {v['kernel_paths']}, rel diff {v['max_rel_diff']:.2e}, "
                f"report {[(d['pattern'], d['fused']) for d in v['fusion_report'] or []]}"
            )
            if v["kernel_paths"] != [CUDNN_EPILOGUE]:
                bad.append(f"fx_epilogue paths {v['kernel_paths']}")
    for name, nodes in w["nodes"].items():
        paths = {n["name"]: n["kernel_path"] for n in nodes if n["kernel_path"]}
        print(f"  {w['key']} {name}: kernel paths {paths}")

# -- 4. Linear+ReLU hot path: wall vs GPU -----------------------------------------------------------------------------
print("\n== 4. Linear+ReLU 64x4096 @ 4096x4096 bf16: wall (blocked_autorange, CUDA-synced) vs GPU per call")
from fusion import manual_fusion as M  # noqa: E402

model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU()).to(dev, torch.bfloat16).eval().requires_grad_(False)
gm = M.fuse_linear_relu(model)
fused = next(m for m in gm.modules() if isinstance(m, M.FusedLinearReLU))
xl = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
wl, bl = model[0].weight, model[0].bias
fns = {
    "eager Sequential": lambda: model(xl),
    "gm(x)": lambda: gm(xl),
    "FusedLinearReLU(x)": lambda: fused(xl),
    "addmm_relu": lambda: M.addmm_relu(xl, wl, bl),
    "raw _addmm_activation": lambda: torch._addmm_activation(bl, xl, wl.t()),
}
with torch.no_grad():
    for f in fns.values():
        f()
    times = B.time_variants(fns, rounds=3, min_run_time=0.1, sync=torch.cuda.synchronize, threads=1)
    for name, f in fns.items():
        med, iqr = summarize(times[name].times_s)
        prof = gpu_profile(f, calls=50)
        print(
            f"  {name:<22} wall {med * 1e6:6.1f} µs (IQR {iqr * 1e6:.1f}) | GPU {prof['gpu_s'] * 1e6:5.1f} µs in "
            f"{prof['kernels_per_call']:.2g} kernels | overhead {max(med - prof['gpu_s'], 0) * 1e6:5.1f} µs"
        )
    # CPU-side cost alone: enqueue many calls without syncing per call (bounded by the GPU's queue, so short)
    for name, f in fns.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        print(f"  {name:<22} CPU enqueue {(t1 - t0) / 200 * 1e6:6.1f} µs/call")

print(f"\n{'ALL OK' if not bad else 'PROBLEMS: ' + '; '.join(bad)} ({time.time() - t_start:.0f} s)")
sys.exit(1 if bad else 0)
