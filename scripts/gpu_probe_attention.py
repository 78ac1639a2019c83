"""Which attention does a compiled HF model run? (issue 23: BERT's attention went through float32 math)

    PYTHONPATH=. python3 scripts/gpu_probe_attention.py bert vit_b_16 gpt2     (on the lent GPU; full suite sizes)

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


def dynamo_calls(model, inputs) -> Counter:
    calls: Counter = Counter()

    def record(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function":
                calls[getattr(n.target, "__name__", str(n.target))] += 1
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
