"""End-to-end rows for the README: eager vs ``backend="fusion"`` vs ``backend="inductor"`` on real models (GPU).

    uv run python -m fusion.compiler.end_to_end                       # resnet18, resnet50, transformer; bf16
    uv run python -m fusion.compiler.end_to_end --models resnet50 --batch 64 --json e2e.json

Each row: wall µs per call (``torch.utils.benchmark``, median), CUDA kernels per call (profiler), speed-up over
eager, and the output's max |Δ| against eager relative to its max |eager| (bf16 tolerance ~1e-2). ResNets run
channels_last; the transformer block is ``nn.TransformerEncoderLayer`` with PyTorch's fused fast path turned off
for all three (the fast path is one opaque op that neither compiler can look into). Random weights (torchvision
architectures, nothing downloaded). On a CPU it refuses: interpreter timings are not speed.
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch
import torch.nn as nn

from fusion.common import table
from fusion.compiler.report import count_cuda_kernels


def _model(name: str, batch: int, dtype: torch.dtype) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    if name.startswith("resnet"):
        import torchvision

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = getattr(torchvision.models, name)(weights=None)
        model = model.cuda().to(dtype).eval().to(memory_format=torch.channels_last)
        x = torch.randn(batch, 3, 224, 224, generator=g).cuda().to(dtype).to(memory_format=torch.channels_last)
        return model, (x,)
    if name == "transformer":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
        x = torch.randn(batch, 512, 1024, generator=g).cuda().to(dtype)
        return layer.cuda().to(dtype).eval(), (x,)
    raise SystemExit(f"unknown model {name!r}: resnet18, resnet50, transformer")


def measure(name: str, batch: int, dtype: torch.dtype, min_run_time: float = 1.0) -> list[dict]:
    from torch.utils.benchmark import Timer

    from fusion import backend

    model, inputs = _model(name, batch, dtype)
    rows = []
    with torch.no_grad():
        want = model(*inputs).float()
        for label in ("eager", "fusion", "inductor"):
            torch._dynamo.reset()
            backend.reports.clear()
            fn = model if label == "eager" else torch.compile(model, backend=label)
            got = fn(*inputs).float()  # compiles
            torch.cuda.synchronize()
            seconds = Timer("f(*x)", globals={"f": fn, "x": inputs}).blocked_autorange(min_run_time=min_run_time).median
            rel = ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
            row = {"model": name, "batch": batch, "backend": label, "us": seconds * 1e6, "rel_err": rel}
            row["kernels"] = count_cuda_kernels(lambda fn=fn: fn(*inputs))
            if label == "fusion":
                row["generated"] = sum(len(r.kernels) for r in backend.reports)
                row["folded_bn"] = sum(
                    p[2] == "folded" for r in backend.reports for part in r.parts for p in part.passes
                )
                row["epilogues"] = sum(
                    p[0] == "cudnn epilogue" and p[2] == "fused"
                    for r in backend.reports
                    for part in r.parts
                    for p in part.passes
                )
            rows.append(row)
    eager_us = rows[0]["us"]
    for row in rows:
        row["speedup"] = eager_us / row["us"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,resnet50,transformer")
    parser.add_argument("--batch", type=int, default=0, help="default: 64 for ResNets, 32 for the transformer")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--json", metavar="PATH", help="also write the rows (with device, torch, date) as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("end_to_end needs a CUDA GPU: on a CPU our kernels run in Triton's interpreter, which is not speed.")
        return 1
    dtype = getattr(torch, args.dtype)
    rows = []
    for name in args.models.split(","):
        batch = args.batch or (32 if name == "transformer" else 64)
        rows += measure(name, batch, dtype)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": args.dtype,
        "date": datetime.date.today().isoformat(),
    }
    print(f"{meta['device']}, torch {meta['torch']}, {args.dtype}, {meta['date']}")
    print(
        table(
            [
                (
                    r["model"],
                    r["batch"],
                    r["backend"],
                    f"{r['us']:.0f}",
                    f"{r['speedup']:.2f}×",
                    r["kernels"],
                    f"{r['rel_err']:.1e}",
                    r.get("generated", "-"),
                    r.get("folded_bn", "-"),
                    r.get("epilogues", "-"),
                )
                for r in rows
            ],
            [
                "model",
                "batch",
                "backend",
                "µs/call",
                "vs eager",
                "CUDA kernels",
                "rel. max |Δ|",
                "generated",
                "BN folded",
                "cuDNN epilogues",
            ],
        )
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
