"""The kernel kinds added on 2026-11-24 (r3) on real CUDA tensors, small enough for compute-sanitizer's memcheck:
looped reductions, cat's masked loads (rotary embedding), a region split in two kernels (grouped-query attention),
max-pool windows reaching into the padding; and (2026-11-25, sixth session) depthwise convolutions as window sums,
through the backend (pass ``depthwise`` runs there). Each result is compared with eager; the exit status counts
failures.

    PYTHONPATH=. compute-sanitizer --tool memcheck python3 scripts/gpu_memcheck_kernels.py     (on the lent GPU)
    uv run python scripts/gpu_memcheck_kernels.py                                              (CPU: interpreter)
"""

from __future__ import annotations

import sys
from unittest import mock

import torch
import torch.nn.functional as F

from fusion import codegen
from fusion.codegen import compile_regions


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def rope(q, k, cos, sin):
    half = q.shape[-1] // 2

    def rot(x):
        return torch.cat((-x[..., half:], x[..., :half]), -1)

    return q * cos + rot(q) * sin, (k * cos + rot(k) * sin)[:, :, None].expand(-1, -1, 2, -1, -1).clone()


def cases(device: str):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)

    yield (
        "looped softmax/var (130 rows of 300, blocks of 16)",
        lambda x: (torch.softmax(x, -1), torch.var_mean(x * 2.0, -1)),
        (r(130, 300),),
        "looped",
    )
    yield "rotary embedding + GQA split", rope, (r(2, 4, 33, 64), r(2, 2, 33, 64), r(33, 64), r(33, 64)), ""
    cl = r(2, 16, 15, 13).to(memory_format=torch.channels_last)
    yield "max-pool 3/2/1 channels_last", lambda x: F.max_pool2d(torch.relu(x * 2 - 1), 3, 2, 1) + 0.5, (cl,), ""
    yield (
        "max-pool dilation 2 ceil_mode",
        lambda x: F.max_pool2d(x * 2, 3, 2, 1, 2, ceil_mode=True),
        (r(2, 3, 11, 9),),
        "",
    )
    ln_t = lambda x: F.layer_norm(x * 2, (64,)).transpose(0, 1).contiguous()  # noqa: E731
    yield "LayerNorm storing its transposed copy", ln_t, (r(4, 197, 64),), ""
    yield (
        "cat of 3 along dim 1",
        lambda a, b, c: torch.cat([a * 2, b, c + 1], 1).relu(),
        (r(3, 5, 7), r(3, 1, 7), r(3, 9, 7)),
        "",
    )

    def depthwise(x, w3, w5):  # ReLU6 → depthwise 3x3 stride 2 → ReLU6 → depthwise 5x5 → + 1: windows in the padding
        y = F.conv2d((x * 1.5 - 0.5).clamp(0, 6), w3, stride=2, padding=1, groups=x.shape[1]).clamp(0, 6)
        return F.conv2d(y, w5, padding=2, groups=x.shape[1]) + 1.0

    dw_in = r(2, 24, 15, 13).to(memory_format=torch.channels_last)
    yield "depthwise 3x3/2 and 5x5/1 windows (backend)", depthwise, (dw_in, r(24, 1, 3, 3), r(24, 1, 5, 5)), "backend"


def main() -> int:
    device = "cuda" if torch.cuda.is_available() and "--cpu" not in sys.argv else "cpu"
    failed = 0
    for name, fn, inputs, how in cases(device):
        if how == "backend":  # passes first (depthwise): torch.compile, an inference graph
            from fusion import backend

            backend.reset()
            with torch.no_grad():
                got = torch.compile(Fn(fn), backend="fusion")(*inputs)
            kernels = [k.name for k in backend.reports[0].parts[0].kernels]
        else:
            with mock.patch.object(codegen, "MAX_RBLOCK", 64 if how == "looped" else codegen.MAX_RBLOCK):
                compiled = compile_regions(Fn(fn), inputs)
                got = compiled(*inputs)
            kernels = [k.name for k in compiled.kernels]
        want = fn(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        try:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            print(f"ok   {name}: {len(kernels)} kernels {kernels}", flush=True)
        except AssertionError as e:
            failed += 1
            print(f"FAIL {name}: {str(e)[:300]}", flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
