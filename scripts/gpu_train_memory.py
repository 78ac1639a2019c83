"""Where a training step's memory goes, per backend: what the forward saves for the backward, and the peak.

For each suite training row (its model and inputs at the suite's sizes; fp32 weights, bf16 autocast on CUDA) and
each backend, one compiled step after a warm-up step, with the caching allocator's counters read at three points:
before the step (weights, inputs), after the forward and loss (what the forward left alive: the saved tensors and the
outputs) and at the step's end, and the peak of the forward and of the whole step. Beside them, the saved tensors
AOTAutograd's partitioner chose (the backward graph's inputs that are neither parameters nor incoming gradients),
grouped by dtype and rank, read by wrapping ``min_cut_rematerialization_partition`` while the step compiles (every
backend here uses that partitioner).

    PYTHONPATH=. python3 scripts/gpu_train_memory.py gpt2_train llama_train --backends=fusion,inductor
    python3 scripts/gpu_train_memory.py --dry-run bert_train          (CPU, tiny sizes: rehearse it)
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch._functorch.partitioners as partitioners  # noqa: E402

from fusion import backend  # noqa: E402, F401  (registers backend="fusion")
from fusion.bench.suite import compile_with  # noqa: E402
from fusion.bench.suite_models import MODELS, scalar_loss  # noqa: E402

SAVED: list[dict] = []  # what the partitioner chose, per compile, while a step compiles


def _spy(original):
    def partition(joint, joint_inputs, **kwargs):
        fw, bw = original(joint, joint_inputs, **kwargs)
        groups, counts = Counter(), Counter()
        for n in bw.graph.find_nodes(op="placeholder"):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and not n.name.startswith(("tangents", "primals")):
                key = f"{str(v.dtype).removeprefix('torch.')} {v.dim()}-d"
                groups[key] += v.numel() * v.element_size()
                counts[key] += 1
        SAVED.append({k: {"tensors": counts[k], "MB": round(groups[k] / 1e6, 1)} for k in sorted(groups)})
        return fw, bw

    return partition


def _patch() -> None:
    original = partitioners.min_cut_rematerialization_partition
    spy = _spy(original)
    partitioners.min_cut_rematerialization_partition = spy
    import torch._inductor.compile_fx as compile_fx

    if getattr(compile_fx, "min_cut_rematerialization_partition", None) is original:
        compile_fx.min_cut_rematerialization_partition = spy


def measure(name: str, label: str, device: str, sizes: str) -> dict:
    spec = MODELS[name]
    model32, inputs32 = spec.build(sizes)
    model = copy.deepcopy(model32).to(device).train()
    inputs = tuple(x.to(device) for x in inputs32)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01)
    fn = compile_with(label, model)
    cuda = device == "cuda"
    mb = lambda b: round(b / 1e6, 1)  # noqa: E731
    allocated = torch.cuda.memory_allocated if cuda else (lambda: 0)

    def step(record: dict | None):
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = allocated()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            out = fn(*inputs)
        loss = scalar_loss(out)
        if record is not None and cuda:
            torch.cuda.synchronize()
            record.update(
                after_forward_MB=mb(allocated() - before),
                forward_peak_MB=mb(torch.cuda.max_memory_allocated() - before),
            )
        loss.backward()
        opt.step()
        if record is not None and cuda:
            torch.cuda.synchronize()
            record.update(
                step_end_MB=mb(allocated() - before), step_peak_MB=mb(torch.cuda.max_memory_allocated() - before)
            )

    SAVED.clear()
    backend.reset()
    torch._dynamo.reset()
    step(None)  # compiles
    row = {"model": name, "backend": label, "saved": list(SAVED)}
    step(row)
    return row


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["gpt2_train", "llama_train"]
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "")
    labels = picked.split(",") if picked else ["fusion", "inductor"]
    device, sizes = ("cpu", "tiny") if dry else ("cuda", "full")
    _patch()
    rows = []
    for name in names:
        for label in labels:
            row = measure(name, label, device, sizes)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        Path(out, "train_memory.json").write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
