"""Where a model's peak memory goes under ``backend="fusion"``: the measured peak of each backend, and the compiled
graph's tensors alive at its largest moment.

For each model (the suite's, at its sizes; one call of inference after warm-up): ``torch.cuda.max_memory_allocated``
above the weights and inputs for eager, ``fusion`` and Inductor; then, for ``fusion``, a walk of each compiled graph
in order with every tensor a node makes alive from its node to the last use of it or of any view of it (the fx
code frees it there), which names the tensors alive at the walk's peak, largest first.

Run it:   PYTHONPATH=. python3 scripts/archive/gpu_peak_memory_walk.py --models t5_encoder [--sizes full] [--top 12]
          (CPU: --device cpu --sizes tiny checks the script; its numbers are only the walk's)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.fx as fx  # noqa: E402

from fusion import backend  # noqa: E402  (a script may import a lesson: this one registers backend="fusion")
from fusion.bench.suite_models import MODELS  # noqa: E402


def _tensors(node: fx.Node) -> list[torch.Tensor]:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def live_walk(gm: fx.GraphModule, top: int) -> dict:
    """The peak of the bytes alive, walking ``gm`` in order (placeholders excluded), and what is alive there."""
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    owner: dict[fx.Node, fx.Node] = {}  # a node -> the node whose memory it is (a view: its base's)
    for n in nodes:
        base = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        same = base is not None and any(
            t.untyped_storage()._cdata == b.untyped_storage()._cdata
            for t in _tensors(n)
            for b in _tensors(base)
            if hasattr(t, "untyped_storage")
        )
        owner[n] = owner.get(base, base) if same else n
    last: dict[fx.Node, int] = {}
    for n in nodes:
        for user in n.users:
            o = owner[n]
            last[o] = max(last.get(o, pos[n]), pos[user])
    alive: dict[fx.Node, int] = {}
    peak, at, where = 0, [], ""
    for i, n in enumerate(nodes):
        if n.op == "call_function" and owner[n] is n:
            size = sum(t.untyped_storage().nbytes() for t in _tensors(n))
            if size:
                alive[n] = size
        now = sum(alive.values())
        if now > peak:
            peak, where = now, n.name
            at = sorted(alive.items(), key=lambda kv: -kv[1])[:top]
        for o in [o for o in alive if last.get(o, pos[o]) <= i]:
            del alive[o]
    return {
        "peak_mb": peak / 2**20,
        "at": where,
        "alive": [
            {"node": o.name, "target": str(o.target)[:60], "mb": b / 2**20,
             "shape": [list(t.shape) for t in _tensors(o)], "dtype": [str(t.dtype) for t in _tensors(o)]}
            for o, b in at
        ],
    }  # fmt: skip


def peak(fn, device: str) -> float:
    if device != "cuda":
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="t5_encoder")
    ap.add_argument("--sizes", default="full")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype) if args.device == "cuda" else torch.float32
    out = {}
    for name in args.models.split(","):
        model, inputs = MODELS[name].build(args.sizes)
        model = model.to(args.device, dtype).eval().requires_grad_(False)
        inputs = tuple(
            x.to(args.device) if x.is_floating_point() is False else x.to(args.device, dtype) for x in inputs
        )
        row = {}
        for be in ("eager", "fusion", "inductor"):
            backend.reset()
            fn = model if be == "eager" else torch.compile(copy.deepcopy(model), backend=be)
            with torch.no_grad():
                fn(*inputs)
                fn(*inputs)
                row[be] = peak(lambda fn=fn, inputs=inputs: fn(*inputs), args.device)
            if be == "fusion":
                row["walks"] = [live_walk(p.graph.graph_module, args.top) for r in backend.reports for p in r.parts
                                if p.graph is not None]  # fmt: skip
        out[name] = row
        print(
            f"== {name}: peak MB above weights and inputs: eager {row['eager']:.1f}, fusion {row['fusion']:.1f}, "
            f"Inductor {row['inductor']:.1f}"
        )
        for w in row["walks"]:
            print(f"   fusion's graph walk: peak {w['peak_mb']:.1f} MB at {w['at']}; alive there:")
            for a in w["alive"]:
                print(f"      {a['mb']:8.1f} MB  {a['node']:<40} {a['target']:<60} {a['shape']} {a['dtype']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
