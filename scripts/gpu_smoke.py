"""GPU correctness smoke test for the generated kernels (Phase 8) and the backend (Phase 9): no timings.

    PYTHONPATH=. python3 scripts/gpu_smoke.py            # on the lent GPU (torch 2.11, Triton 3.6)
    uv run python scripts/gpu_smoke.py --cpu             # dry run here: CPU tensors, Triton's interpreter

Each check compiles a model for CUDA tensors (Triton compiles the generated source for real, no interpreter),
runs it on fresh random inputs and compares with eager by max |diff| and ‖out − ref‖ / ‖ref‖. A failing check
prints its traceback and the script goes on; the exit status is the number of failed checks.
"""

from __future__ import annotations

import sys
import traceback

import torch

from fusion import models


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def check(name: str, fn, tol: float) -> bool:
    try:
        out, ref = fn()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        worst = max(rel(o, r) for o, r in zip(outs, refs, strict=True))
        ok = worst <= tol and all(torch.isfinite(o).all() for o in outs)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {worst:.2e} (tol {tol:.0e})", flush=True)
        return ok
    except Exception:
        print(f"FAIL {name}: exception", flush=True)
        traceback.print_exc()
        return False


def codegen_checks(dev: str) -> list[bool]:
    from fusion.codegen import compile_regions

    results = []
    cases = [
        ("ElementwiseChain", models.ElementwiseChain(257), lambda: (torch.randn(67, 257),)),
        ("NormGELUResidual", models.NormGELUResidual(), lambda: models.norm_inputs(batch=3, seq=5)),
        ("ScaledSoftmax", models.ScaledSoftmax(), lambda: models.norm_inputs(batch=3, seq=5)),
        ("TransformerMLP", models.TransformerMLP(), models.transformer_inputs),
        ("TinyNet", models.TinyNet(), models.tiny_inputs),
        ("ConvBNNet eval", models.ConvBNNet().eval(), models.conv_inputs),
    ]
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 5e-3)):
        for name, model, make in cases:

            def run(model=model, make=make, dtype=dtype):
                m = model.to(dev, dtype)
                xs = tuple(x.to(dev, dtype) for x in make())
                compiled = compile_regions(m, xs)
                xs2 = tuple(torch.randn_like(x) for x in xs)  # fresh inputs of the same shapes
                with torch.no_grad():
                    out, ref = compiled(*xs2), m(*xs2)
                sync()
                print(f"     {len(compiled.kernels)} generated kernels", flush=True)
                return out, ref

            results.append(check(f"codegen {name} {dtype}", run, tol))

    def noncontig():
        m = models.ElementwiseChain(33).to(dev)
        x = torch.randn(66, 40, device=dev)[::2, 3:36]  # strided rows, offset columns
        compiled = compile_regions(m, (x,))
        return compiled(x), m(x)

    results.append(check("codegen non-contiguous input", noncontig, 1e-5))
    return results


def backend_checks(dev: str) -> list[bool]:
    import torchvision

    import fusion.backend as fb

    results = []

    def compiled_vs_eager(model, xs):
        fb.reset()
        with torch.no_grad():
            ref = model(*xs)
            out = torch.compile(model, backend="fusion")(*xs)
        sync()
        for r in fb.reports:
            print(f"     graph: {len(r.kernels)} generated kernels", flush=True)
        if not any(r.kernels for r in fb.reports):
            raise AssertionError("no generated kernel ran: " + "; ".join(str(r) for r in fb.reports))
        return out, ref

    # MobileNetV2: every conv's folded bias joins a generated kernel (ReLU6 is not a cuDNN epilogue). ResNet-18's
    # convs all go to the cuDNN epilogue, so it may run without a generated kernel: not checked here.
    mnet = torchvision.models.mobilenet_v2().eval().to(dev, torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 64, 64, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    results.append(check("backend mobilenet_v2 bf16 channels_last", lambda: compiled_vs_eager(mnet, (x,)), 5e-2))

    torch.backends.mha.set_fastpath_enabled(False)  # else the layer is one opaque op for every backend
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0).eval().to(dev)
    xt = torch.randn(2, 9, 64, device=dev)
    results.append(check("backend TransformerEncoderLayer fp32", lambda: compiled_vs_eager(layer, (xt,)), 1e-4))

    dd = models.DataDependentBlock().to(dev) if hasattr(models, "DataDependentBlock") else None
    if dd is not None:
        xd = tuple(t.to(dev) for t in models.data_dependent_inputs())
        results.append(check("backend data-dependent (graph break)", lambda: compiled_vs_eager(dd, xd), 1e-5))

    mlp = models.MLP().to(dev)
    xm = models.mlp_inputs()[0].to(dev).requires_grad_(True)

    def training():
        fb.reset()
        out = torch.compile(mlp, backend="fusion")(xm)
        (g,) = torch.autograd.grad(out.sum(), xm)
        ref = mlp(xm)
        (gr,) = torch.autograd.grad(ref.sum(), xm)
        return (out, g), (ref, gr)

    results.append(check("backend MLP training (forward + input grad)", training, 1e-5))
    return results


def main() -> int:
    print(f"torch {torch.__version__}", flush=True)
    try:
        import triton

        print(f"triton {triton.__version__}", flush=True)
    except ImportError:
        print("triton missing", flush=True)
    dev = "cpu" if "--cpu" in sys.argv else "cuda"  # --cpu: a dry run of this script through Triton's interpreter
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check (--cpu runs the checks on CPU tensors through the interpreter)")
        return 0
    print(torch.cuda.get_device_name() if dev == "cuda" else "CPU dry run", flush=True)
    results = codegen_checks(dev) + backend_checks(dev)
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(main())
