"""What ``backend="fusion"`` leaves to aten on the suite's models, and why: every aten call outside the generated
kernels, grouped by op and reason and counted, per model, for its inference call and its training step.

The suite's models (``fusion/bench/suite_models.py``) at their tiny sizes on the CPU in float32, compiled with
``backend="fusion"`` (the C renderer): the row ``<model>`` (inference) and ``<model>_train`` (forward, backward and
SGD) where the suite has one, each in a fresh Dynamo, its outputs checked against eager (the suite's accuracy rule).
An aten call outside the kernels is one of:

- ``fallback``: a node of a region the code generator refused (its report's reason; ``PartReport.fallbacks``);
- ``alone``: a fusible op whose span holds no other op to fuse with (a region needs two), so it runs as aten;
- ``not fusible``: an op Phase 6's rule keeps out of every region (``fusion.regions.fusible_reason``);
- ``library``: a GEMM, convolution or attention call: compute-bound, a library's kernel by design (counted only);
  a window sum (a depthwise convolution or an average pool renamed for a kernel) left to ``torch.convolution`` is a
  ``fallback`` instead.

The report is the same on a GPU: the regions, and the generator's reasons, do not depend on the device.

Run it:   uv run python scripts/fallbacks.py [--models swin_t,maxvit_t] [--no-train] [--no-infer] [--detail]
          (default: swin_t maxvit_t convnext_tiny t5_encoder mistral opt)
On a GPU: python3 scripts/fallbacks.py --device cuda --models t5_encoder --no-infer --detail  (full sizes, bf16:
          the CUDA-only passes and rules apply, and autocast's casts are CUDA's)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.fx as fx  # noqa: E402

from fusion import backend as _backend  # noqa: E402, F401  (a script may import a lesson: registers "fusion")
from fusion import benchmark as B  # noqa: E402
from fusion import regions  # noqa: E402  (Phase 6's rule: which ops may share a kernel)
from fusion.aten.nodes import is_view_node  # noqa: E402
from fusion.bench import suite as S  # noqa: E402
from fusion.compiler import driver  # noqa: E402
from fusion.compiler.report import is_window_sum, library_name  # noqa: E402

DEFAULT = "swin_t,maxvit_t,convnext_tiny,t5_encoder,mistral,opt"
# Compute-bound calls a library runs by design (not a fusion loss): GEMMs, convolutions, attention kernels
LIBRARY = re.compile(r"^(mm|bmm|addmm|baddbmm|convolution|convolution_backward|_scaled_dot_product_\w+|cudnn_\w+)$")


class Capture:
    """Each aten graph handed to code generation (after the passes), with its PartReport: ``driver.kernels``
    wrapped for the duration (``driver.generate`` looks it up at each call)."""

    def __init__(self) -> None:
        self.parts: list[tuple[fx.GraphModule, object]] = []

    def __enter__(self) -> Capture:
        self._kernels = driver.kernels

        def kernels(gm, part, opts):
            self.parts.append((gm, part))
            return self._kernels(gm, part, opts)

        driver.kernels = kernels
        return self

    def __exit__(self, *exc) -> None:
        driver.kernels = self._kernels


def _short(text: str) -> str:
    """One line per kind of reason: node numbers (clone_7, getitem_16) and shapes folded away."""
    text = re.sub(r"\b([a-z_]+?)_\d+\b", r"\1", text)
    text = re.sub(r"\(\d+(, \d+)*,?\)", "(…)", text)
    return text.removeprefix("runs as an aten call: ")[:150]


def outside_kernels(gm: fx.GraphModule, part) -> Counter:
    """(kind, op, reason) -> count for every aten call of ``gm`` that no generated kernel covers."""
    covered = {n.name for k in part.kernels for n in getattr(getattr(k, "region", None), "nodes", ())}
    fell = {what.removeprefix("op: "): why for what, why in part.fallbacks}
    out = Counter()
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.name in covered:
            continue
        op = library_name(n)
        if n.name in fell:  # a view (a split's getitem) the generator refused too
            out["fallback", op, _short(fell[n.name])] += 1
        elif is_view_node(n):
            continue
        elif is_window_sum(n):  # a depthwise conv or an average pool renamed for a kernel, run as torch.convolution
            why = next((p[3] for p in part.passes if p[1] == n.name and p[2] == "torch.convolution"), "")
            out["fallback", "window sum", _short(why or "no kernel computes it (the C renderer takes no window)")] += 1
        elif LIBRARY.match(op):
            out["library", op, ""] += 1
        elif regions.is_fusible_node(n):
            out["alone", op, "fusible, but no other op of its span to fuse with (a region needs two)"] += 1
        else:
            out["not fusible", op, regions.fusible_reason(n)] += 1
    for what, why in part.fallbacks:  # the generator's rows that name no single node ("the whole graph")
        if not what.startswith("op: "):
            out["fallback", what, _short(why)] += 1
    return out


def detail(gm: fx.GraphModule, part) -> list[str]:
    """Each non-library aten call outside kernels with what it reads and who reads it (kernel or op)."""
    owner = {
        n: f"kernel {i}" for i, k in enumerate(part.kernels) for n in getattr(getattr(k, "region", None), "nodes", ())
    }

    def tag(x: fx.Node) -> str:  # a node and where it runs: its kernel, else its op
        return f"{x.name}[{owner.get(x, getattr(x.target, '__name__', x.op))}]"

    lines = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in owner or is_view_node(n) or LIBRARY.match(library_name(n)):
            continue
        val = n.meta.get("val")
        shape = f"{tuple(val.shape)} {str(val.dtype).removeprefix('torch.')}" if isinstance(val, torch.Tensor) else ""
        reads, users = map(tag, n.all_input_nodes), map(tag, n.users)
        lines.append(
            f"    {part.kind}: {n.name} = {library_name(n)} {shape} <- {', '.join(reads)} -> {', '.join(users)}"
        )
    return lines


def run_row(name: str, device: str = "cpu", details: bool = False) -> tuple[str, Counter, dict]:
    """One suite row through eager and fusion: its status and what each of its aten graphs left outside kernels."""
    driver.reset()
    with Capture() as cap, contextlib.redirect_stdout(io.StringIO()):
        res = S.run_suite(B.LESSON, models=[name], backends=["eager", "fusion"], device=device, rounds=0)
    row = res["models"][0]
    f = row.get("backends", {}).get("fusion", {})
    status = f.get("status", row["status"])
    why = f.get("reason") or row.get("reason") or ""
    seen, counts = Counter(), Counter()
    for gm, part in cap.parts:
        seen += outside_kernels(gm, part)
        if details:
            print("\n".join(detail(gm, part)))
        counts["kernels"] += len(part.kernels)
    counts["graphs"] = len(cap.parts)
    counts["not lowered"] = sum(bool(r.error) for r in driver.reports)
    return f"{status} {why}".strip(), seen, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT, help=f"comma-separated suite models (default {DEFAULT})")
    ap.add_argument("--no-train", action="store_true", help="skip the training rows")
    ap.add_argument("--no-infer", action="store_true", help="skip the inference rows")
    ap.add_argument("--device", default="cpu", help="cpu (tiny sizes, float32) or cuda (full sizes, bf16)")
    ap.add_argument("--detail", action="store_true", help="each aten call outside kernels with its inputs and users")
    args = ap.parse_args(argv)
    names = []
    for m in (m for m in args.models.split(",") if m):
        if m not in S.MODELS:
            ap.error(f"unknown suite model {m!r}. Fix: one of {', '.join(x for x in S.MODELS if '_train' not in x)}")
        names += [m] * (not args.no_infer) + [f"{m}_train"] * (not args.no_train and f"{m}_train" in S.MODELS)
    where = "CPU float32, tiny sizes" if args.device == "cpu" else f"{args.device} bf16, full sizes"
    print(f"torch {torch.__version__}, {where}, backend='fusion', eager for accuracy")
    S.warm_compilers(["fusion"], S.SuiteConfig(device=args.device))
    bad, totals = 0, []
    for name in names:
        t0 = time.perf_counter()
        status, seen, counts = run_row(name, args.device, args.detail)
        kinds = Counter()
        for (kind, _, _), c in seen.items():
            kinds[kind] += c
        left = sum(c for k, c in kinds.items() if k != "library")
        totals.append((name, kinds["fallback"], left))
        print(
            f"\n{name}: {status}; {counts['kernels']} kernels in {counts['graphs']} aten graphs "
            f"(not lowered {counts['not lowered']}); outside kernels: fallbacks {kinds['fallback']}, alone "
            f"{kinds['alone']}, not fusible {kinds['not fusible']}, library {kinds['library']} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        for (kind, op, why), c in sorted(seen.items(), key=lambda kv: (kv[0][0] == "library", -kv[1], kv[0])):
            print(f"  {c:3d} x {kind:11s} {op:28s} {why}".rstrip())
        bad += not status.startswith("pass")
    print("\nper row: fallbacks / every non-library aten call outside kernels")
    for name, fb, left in totals:
        print(f"  {name:24s} {fb:4d} / {left:4d}")
    print(f"{len(names) - bad}/{len(names)} pass")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
