"""The C renderer with and without -fno-tree-sink (``c_probes.SUNK_SELECT_PROBE`` adds it where gcc miscompiles): CPU
suite models at their CPU sizes, ``backend="fusion"``, 2 threads, 15 blocks of 0.1 s, medians; one process per
variant, run alternately:

    python scripts/archive/cpu_ab_tree_sink.py default|sink resnet18,mobilenet_v2,bert,gpt2
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from fusion import backend  # noqa: F401  (registers backend="fusion")
from fusion.bench.suite_models import MODELS
from fusion.kernels import c_probes, c_runtime


def main() -> None:
    variant, models = sys.argv[1], sys.argv[2].split(",")
    if variant == "sink":  # the flags without -fno-tree-sink: its probe left out
        c_probes.MISCOMPILES = tuple(m for m in c_probes.MISCOMPILES if m[2] != "-fno-tree-sink")
        c_runtime.forget_compiler()
    print(variant, "-fno-tree-sink" in c_runtime.compiler()[1])
    torch.set_num_threads(2)
    for name in models:
        torch.manual_seed(0)
        model, inputs = MODELS[name].build("cpu")
        fn = torch.compile(model.eval(), backend="fusion")
        with torch.no_grad():
            for _ in range(3):
                fn(*inputs)
            blocks = []
            for _ in range(15):
                start, calls = time.perf_counter(), 0
                while time.perf_counter() - start < 0.1:
                    fn(*inputs)
                    calls += 1
                blocks.append((time.perf_counter() - start) / calls * 1e3)
        print(f"{variant} {name}: median {statistics.median(blocks):.3f} ms")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
