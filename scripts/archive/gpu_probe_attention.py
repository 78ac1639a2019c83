"""Which attention does a compiled HF model run? (issue 23: BERT's attention went through float32 math)

    PYTHONPATH=. python3 scripts/archive/gpu_probe_attention.py bert vit_b_16 gpt2     (on the lent GPU; full suite sizes)

For each model: the attention kernels eager launches (torch.profiler), the attention-like aten ops in the graph
AOTAutograd hands our backend (our decomposition table), and the mask HuggingFace passes under compile.
"""

from __future__ import annotations

import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from fusion.aten.capture import decomposition_table
from fusion.bench.suite_models import MODELS

WORDS = ("attention", "bmm", "softmax", "any", "where", "fill", "masked", "_to_copy", "convert", "expand", "clone")


def eager_kernels(model, inputs) -> Counter:
    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(*inputs)
            torch.cuda.synchronize()
    return Counter({e.key[:90]: e.count for e in prof.key_averages() if e.device_time_total > 0})


def graph_ops(model, inputs) -> tuple[Counter, list[str]]:
    from torch._dynamo.backends.common import aot_autograd

    ops: Counter = Counter()
    sdpa_args: list[str] = []

    def record(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function":
                name = str(n.target)
                ops[name] += 1
                if "attention" in name and len(sdpa_args) < 2:
                    sdpa_args.append(
                        f"{name}: "
                        + ", ".join(
                            f"{tuple(a.meta['val'].shape)} {a.meta['val'].dtype} stride {a.meta['val'].stride()}"
                            if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
                            else repr(a)
                            for a in n.args
                        )
                    )
        return gm.forward

    backend = aot_autograd(fw_compiler=record, inference_compiler=record, decompositions=decomposition_table())
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*inputs)
    return ops, sdpa_args


def why_not_fused(node) -> list[str]:
    """Rebuild an sdpa call's arguments (real tensors with the traced shapes, dtypes and strides) and ask torch's
    kernel checks why flash / efficient / cuDNN attention would refuse them."""
    import warnings

    def real(a):
        v = a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a
        if isinstance(v, torch.Tensor):
            storage = torch.randn(v.untyped_storage().nbytes() // v.element_size() + 1, device=v.device).to(v.dtype)
            return storage.as_strided(v.shape, v.stride(), v.storage_offset())  # the traced strides, expands kept
        return v

    args = [real(a) for a in node.args]
    kwargs = {k: real(v) for k, v in node.kwargs.items()}
    q, k, v = args[:3]
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    out = [
        f"q {tuple(q.shape)} {q.dtype} {q.stride()}; mask "
        + (f"{tuple(mask.shape)} {mask.dtype} {mask.stride()}" if isinstance(mask, torch.Tensor) else repr(mask))
        + f"; kwargs { {k: (type(x).__name__ if isinstance(x, torch.Tensor) else x) for k, x in kwargs.items()} }"
    ]
    params = torch.backends.cuda.SDPAParams(
        q,
        k,
        v,
        mask,
        float(kwargs.get("dropout_p", 0.0)),
        bool(kwargs.get("is_causal", False)),
        bool(kwargs.get("enable_gqa", False)),
    )
    for name in ("flash", "efficient", "cudnn"):
        check = getattr(torch.backends.cuda, f"can_use_{name}_attention", None)
        if check is None:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = check(params, True)
        out.append(f"{name}: {ok} " + " | ".join(str(w.message)[:200] for w in caught))
    return out


def dynamo_calls(model, inputs) -> Counter:
    calls: Counter = Counter()

    def record(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function":
                calls[getattr(n.target, "__name__", str(n.target))] += 1
                if "scaled_dot_product" in str(n.target) and calls[n.target.__name__] == 1:
                    try:
                        print("  sdpa in dynamo's graph:", *why_not_fused(n), sep="\n    ")
                    except Exception as e:  # noqa: BLE001 - a probe: say what failed and go on
                        print("  sdpa check failed:", type(e).__name__, e)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=record)(*inputs)
    return calls


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name())
    for name in sys.argv[1:] or ["bert", "vit_b_16"]:
        spec = MODELS[name]
        model, inputs = spec.build("full")
        model = model.cuda().bfloat16().eval()
        inputs = tuple(t.cuda().bfloat16() if t.is_floating_point() else t.cuda() for t in inputs)
        print(f"\n===== {name}")
        k = eager_kernels(model, inputs)
        print("eager attention-ish kernels:", {n: c for n, c in k.items() if any(w in n.lower() for w in
              ("attn", "attention", "fmha", "flash", "cudnn", "softmax", "gemm"))})  # fmt: skip
        calls = dynamo_calls(model, inputs)
        print("dynamo graph calls:", dict(calls.most_common(25)))
        ops, sdpa = graph_ops(model, inputs)
        print("aten graph ops:", {n: c for n, c in ops.most_common() if any(w in n for w in WORDS)})
        print("aten graph, all ops:", dict(ops.most_common(30)))
        for line in sdpa:
            print("  ", line)


if __name__ == "__main__":
    main()
