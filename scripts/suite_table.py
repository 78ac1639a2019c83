"""The README's suite table from suite JSON files (``fusion.bench.suite``'s output): numbers copied by a program.

    python3 scripts/suite_table.py scripts/results/h100-2026-11-25-w-suite.json scripts/results/h100-2026-11-25-x-suite.json

One markdown row per model (eager's median, each backend's speed-up against eager, first calls, peak memory), the
geomean row last, and the GPU-bound times (``+cudagraphs`` against reduce-overhead). A model in several files is one
row: the first file's backends, then those it lacks from later files (each ratio against its own file's eager;
marked †): name the newest file first. Standard library only.
"""

from __future__ import annotations

import json
import math
import sys

COLUMNS = ["fusion", "fusion+cudagraphs", "inductor", "inductor+reduce-overhead"]


def main(paths: list[str]) -> None:
    rows: list[dict] = []
    by_model: dict[str, dict] = {}
    joined: set[str] = set()  # models with backends from more than one file
    for path in paths:
        with open(path) as f:  # a model not measured in a file (over its budget, timed out) is left out of it
            for r in json.load(f)["models"]:
                if r.get("status", "ok") != "ok":
                    continue
                if r["model"] not in by_model:
                    by_model[r["model"]] = r = {**r, "backends": dict(r["backends"])}
                    rows.append(r)
                    continue
                # the same model in a later file (another process): the backends the row lacks join it, each with
                # its ratio against its own process's eager (the eager median shown is the first file's); marked †
                row = by_model[r["model"]]
                extra = {k: v for k, v in r["backends"].items() if k not in row["backends"]}
                if extra:
                    row["backends"].update(extra)
                    joined.add(r["model"])
    for row in rows:
        row["model"] += " †" * (row["model"] in joined)
    print("| model | eager | fusion | fusion +cudagraphs | Inductor | Inductor reduce-overhead "
          "| first call, s (fusion / Inductor) | peak MB (eager / fusion / Inductor) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    speedups: dict[str, list[float]] = {c: [] for c in COLUMNS}
    firsts: dict[str, list[float]] = {"fusion": [], "inductor": []}
    for row in rows:
        b = row["backends"]
        cells = []
        for c in COLUMNS:
            s = b.get(c, {}).get("speedup_vs_eager")
            cells.append("-" if s is None else f"{s:.2f}×")
            if s is not None:
                speedups[c].append(s)
        for c in firsts:
            if b.get(c, {}).get("first_call_s") is not None:
                firsts[c].append(b[c]["first_call_s"])
        first = " / ".join(f"{b[c]['first_call_s']:.1f}" if b.get(c, {}).get("first_call_s") is not None else "-"
                           for c in ("fusion", "inductor"))  # fmt: skip
        peak = " / ".join(f"{b[c]['peak_memory_bytes'] / 1e6:.0f}" if b.get(c, {}).get("peak_memory_bytes")
                          else "-" for c in ("eager", "fusion", "inductor"))  # fmt: skip
        print(f"| {row['model']} | {b['eager']['median_s'] * 1e3:.2f} ms | {' | '.join(cells)} | {first} | {peak} |")
    geo = [f"**{math.exp(sum(map(math.log, v)) / len(v)):.2f}×**" if v else "-" for v in speedups.values()]
    mean = " / ".join(f"{sum(v) / len(v):.1f}" if v else "-" for v in firsts.values())
    print(f"| **geomean ({len(rows)} models)** | | {' | '.join(geo)} | mean {mean} | |")
    print("\nGPU-bound, fusion + CUDA graphs / reduce-overhead, ms: " + ", ".join(
        f"{r['model']} {r['backends']['fusion+cudagraphs']['median_s'] * 1e3:.3f} / "
        f"{r['backends']['inductor+reduce-overhead']['median_s'] * 1e3:.3f}"
        for r in rows if "fusion+cudagraphs" in r["backends"] and "inductor+reduce-overhead" in r["backends"]))  # fmt: skip
    spread = [  # the IQR of a backend's timed blocks over their median: how far one row's ratio can be trusted
        f"{r['model']} {' / '.join(_spread(r['backends'].get(c, {})) for c in ('eager', 'fusion', 'inductor'))}"
        for r in rows
    ]
    if any("%" in s for s in spread):
        print("\nSpread of the timed blocks (IQR / median; eager / fusion / Inductor): " + ", ".join(spread))


def _spread(r: dict) -> str:
    iqr, median = r.get("iqr_s"), r.get("median_s")
    return f"{100 * iqr / median:.0f} %" if iqr is not None and median else "-"


if __name__ == "__main__":
    main(sys.argv[1:])
