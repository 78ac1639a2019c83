"""Generated kernels, aten fallbacks and library calls of ``backend="fusion"`` per suite model, on the CPU at the
suite's tiny sizes (inference under ``no_grad``; ``<model>_train`` rows run forward and backward). A refactor of code
generation is checked with it: the counts of two checkouts side by side (``ROOT=<checkout>`` picks the package).

Run it:   uv run python scripts/kernel_counts.py resnet18,bert,llama_train [> counts.txt]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("ROOT", str(Path(__file__).resolve().parent.parent)))

import torch  # noqa: E402

from fusion import backend as _backend  # noqa: E402, F401  (a script may import a lesson: registers "fusion")
from fusion.bench import suite_models as SM  # noqa: E402
from fusion.compiler import driver  # noqa: E402


def counts(name: str) -> str:
    m = next(s for s in SM.SUITE if s.name == name)
    model, inputs = m.build("tiny")
    driver.reset()
    torch.manual_seed(0)
    f = torch.compile(model, backend="fusion")
    if m.train:  # as the suite steps it: batch norm's statistics from the batch, dropout on
        model.train()
        out = f(*inputs)
        out = getattr(out, "last_hidden_state", out)
        outs = out if isinstance(out, (tuple, list)) else [out]
        sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor)).backward()
    else:
        with torch.no_grad():
            f(*inputs)
    parts = [p for rep in driver.reports for p in rep.parts]
    kernels = sum(len(p.launchers()) for p in parts)
    fallbacks = sum(len(p.fallbacks) for p in parts)
    library = sum(sum(p.library_calls.values()) for p in parts)
    return f"{name}: kernels {kernels} fallbacks {fallbacks} library {library}"


if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        print(counts(name), flush=True)
