"""The README's results block, generated from the raw files in ``scripts/results/`` (numbers are never typed in).

    python3 scripts/results_table.py            # rewrite the block between the README's results markers
    python3 scripts/results_table.py --print    # print the block, change nothing
    python3 scripts/results_table.py --check    # exit 1 when the README's block is not what the raw files give

What it reads (top-level files of ``scripts/results/`` only; ``archive/`` and ``superseded/`` are history):

* every model-suite JSON (``"schema": "suite-1"``, written by ``scripts/gpu_suite.py`` / ``fusion.benchmark --suite``),
  grouped by card (``meta.device_name``). Per card and model the newest row that measured both ``fusion`` and
  Inductor is the row; a standard backend that row lacks is taken from the newest other file that has it (marked †,
  its ratio against eager in its own process). One table of inference models and one of training steps per card,
  each row with the date and file it comes from.
* the newest CPU suite JSON (``cpu-*.json``, ``scripts/gpu_suite.py --cpu``) that timed ``fusion`` and Inductor: one
  table of its rows, with its CPU, threads and C compiler.
* Phase 10's newest multi-GPU run of each GPU count, from ``scripts/gpu_overlap.py`` (``*-overlap-x*.json``, or
  the rows rank 0 printed, ``*-overlap-x*-compiled.jsonl``, whose card and torch come from the run's JSON of the
  same name).

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "scripts" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
BACKENDS = ["fusion", "fusion+cudagraphs", "inductor", "inductor+reduce-overhead"]
HEADERS = ["fusion", "fusion +cudagraphs", "Inductor", "Inductor reduce-overhead"]
TRAIN_BACKENDS = ["fusion", "inductor"]
VARIANTS = {  # Phase 10's variants, as scripts/gpu_overlap.py names them, and what each one is
    "unscheduled": ("unscheduled", "the captured aten graph run op by op, uncompiled, in its traced order"),
    "ours": ("ours", "the same uncompiled graph in the order Phase 10's scheduler picks (`schedule_overlap`)"),
    "fusion": ("fusion", 'the step compiled by `torch.compile(backend="fusion")`, collectives where they were traced'),
    "fusion+overlap": (
        "fusion + overlap",
        'the same with `options={"overlap": True}`: Phase 10\'s scheduler as a pass',
    ),
    "inductor": ("Inductor", "`torch.compile` of the same graph, Inductor's default"),
    "inductor_overlap": ("Inductor + overlap", "the same with Inductor's `enable_overlap_scheduling`"),
}
STEPS = {"dp": "data parallel", "fsdp": "FSDP-style", "tp": "tensor parallel"}


def _link(path: Path) -> str:
    return f"[{path.name}]({path.relative_to(ROOT).as_posix()})"


def _meta(doc: dict) -> dict:
    meta = doc.get("meta", {})
    return meta["calls"][-1] if "calls" in meta and meta["calls"] else meta


def _suite_docs(pattern: str = "*.json"):
    """(path, document, its meta) of every suite JSON (``"schema": "suite-1"``) named like ``pattern``."""
    for path in sorted(RESULTS.glob(pattern)):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("schema") == "suite-1":
            yield path, doc, _meta(doc)


def suite_files() -> list[tuple[str, Path, dict]]:
    """(date, path, document) of every suite JSON measured on a GPU, oldest first."""
    out = [(str(meta.get("date", "")), path, doc) for path, doc, meta in _suite_docs()
           if meta.get("device") == "cuda" and meta.get("device_name")]  # fmt: skip
    return sorted(out, key=lambda t: (t[0], t[1].name))


def card_rows(files: list[tuple[str, Path, dict]], train: bool) -> dict[str, list[dict]]:
    """Per card, one row per model: {model, title, date, path, eager, backends: {name: (value dict, path or None)}}."""
    seen: dict[tuple[str, str], list[tuple[str, Path, dict, dict]]] = {}
    for date, path, doc in files:
        meta = _meta(doc)
        for row in doc.get("models", []):
            if row.get("status", "ok") != "ok" or bool(row.get("train")) != train or "eager" not in row["backends"]:
                continue
            seen.setdefault((meta["device_name"], row["model"]), []).append((date, path, meta, row))
    cards: dict[str, list[dict]] = {}
    wanted = TRAIN_BACKENDS if train else BACKENDS
    for (card, model), found in seen.items():
        found = found[::-1]  # newest first
        base = next((f for f in found if all(k in f[3]["backends"] for k in ("fusion", "inductor"))), None)
        if base is None:
            continue
        date, path, meta, row = base
        backends = {}
        for name in wanted:
            if row["backends"].get(name, {}).get("speedup_vs_eager") is not None:
                backends[name] = (row["backends"][name], None)
                continue
            other = next((f for f in found if f[3]["backends"].get(name, {}).get("speedup_vs_eager") is not None), None)
            if other is not None:
                backends[name] = (other[3]["backends"][name], other[1])
        cards.setdefault(card, []).append({
            "model": model, "date": date[:10], "path": path, "torch": meta.get("torch_version", "?"),
            "eager": row["backends"]["eager"]["median_s"], "backends": backends,
        })  # fmt: skip
    for rows in cards.values():
        rows.sort(key=lambda r: r["model"])
    return cards


def _ratio(cell) -> str:
    if cell is None:
        return "-"
    value, elsewhere = cell
    return f"{value['speedup_vs_eager']:.2f}×" + (" †" if elsewhere else "")


def _first(row: dict) -> str:
    def one(name):
        cell = row["backends"].get(name)
        return "-" if cell is None or cell[0].get("first_call_s") is None else f"{cell[0]['first_call_s']:.1f}"

    return f"{one('fusion')} / {one('inductor')}"


def _geomean(values: list[float]) -> str:
    return f"**{math.exp(sum(map(math.log, values)) / len(values)):.2f}×**" if values else "-"


def _table(card: str, rows: list[dict], names: list[str], headers: list[str], what: str) -> list[str]:
    torches = sorted({r["torch"] for r in rows})
    dates = sorted({r["date"] for r in rows})
    span = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    out = [f"**{what} — {card}**, torch {', '.join(torches)}, bf16, measured {span}:", ""]
    out.append(f"| model | eager | {' | '.join(headers)} | first call, s (fusion / Inductor) | measured |")
    out.append("|---|---|" + "---|" * len(headers) + "---|---|")
    joined = []
    for r in rows:
        cells = [_ratio(r["backends"].get(n)) for n in names]
        joined += [(n, r["backends"][n][1]) for n in names if n in r["backends"] and r["backends"][n][1]]
        out.append(f"| {r['model']} | {r['eager'] * 1e3:.2f} ms | {' | '.join(cells)} | {_first(r)} "
                   f"| {r['date']}, {_link(r['path'])} |")  # fmt: skip
    if len(rows) > 2:  # a geomean of two rows says little
        geo = [_geomean([r["backends"][n][0]["speedup_vs_eager"] for r in rows if n in r["backends"]]) for n in names]
        out.append(f"| **geomean ({len(rows)})** | | {' | '.join(geo)} | | |")
    out.append("")
    if joined:
        files = sorted({p.name: p for _, p in joined}.values(), key=lambda p: p.name)
        out.append(
            "† from another process, its ratio against its own eager: " + ", ".join(_link(p) for p in files) + "."
        )
        out.append("")
    return out


def _overlap_runs() -> list[tuple[str, Path, list[dict], dict]]:
    """Every Phase 10 multi-GPU run kept: (date, file, step rows, meta)."""
    runs = []
    for path in RESULTS.glob("*-overlap-x*.json"):
        try:
            ranks = json.loads(path.read_text()).get("ranks") or []
        except (OSError, ValueError):
            continue
        rank0 = next((r for r in ranks if isinstance(r, dict) and r.get("rank") == 0), None)
        if rank0 and rank0.get("steps"):
            runs.append((str(rank0.get("date", "")), path, [r for r in rank0["steps"] if "step_ms" in r], rank0))
    for path in RESULTS.glob("*-overlap-x*-compiled.jsonl"):
        lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
        sibling = path.with_name(path.name.replace("-compiled.jsonl", ".json"))
        meta = {}
        if sibling.exists():
            ranks = json.loads(sibling.read_text()).get("ranks") or [{}]
            meta = {k: ranks[0].get(k) for k in ("device", "torch", "date", "world_size")}
        date = meta.get("date") or re.search(r"\d{4}-\d\d-\d\d", path.name).group(0)
        runs.append((str(date), path, [r for r in lines if "step_ms" in r], meta))
    for path in RESULTS.glob("*-overlap-steps.jsonl"):  # one row per world size, step and variant, as measured
        lines = [json.loads(s) for s in path.read_text().splitlines() if s.strip()]
        rows = [r for r in lines if "step_ms" in r]
        order = list(VARIANTS)
        rows.sort(key=lambda r: (r["world"], r["step"], order.index(r["variant"]) if r["variant"] in order else 99))
        sibling = next(iter(sorted(path.parent.glob(path.name.replace("-steps.jsonl", "-x*.json")))), None)
        ranks = (json.loads(sibling.read_text()).get("ranks") or [{}]) if sibling else [{}]
        meta = {k: ranks[0].get(k) for k in ("device", "torch", "date")}
        meta["world_size"] = " and ".join(str(w) for w in sorted({r["world"] for r in rows}))
        date = meta.get("date") or re.search(r"\d{4}-\d\d-\d\d", path.name).group(0)
        runs.append((str(date), path, rows, meta))
    return runs


def _newest(runs: list[tuple[str, Path, list[dict], dict]]) -> tuple[str, Path, list[dict], dict]:
    steps_file = lambda r: r[1].name.endswith("-steps.jsonl")  # noqa: E731  (every world size of a run in one file)
    return max(runs, key=lambda r: (r[0], steps_file(r), len({x.get("variant") for x in r[2]}), r[1].name))


def overlap_runs_per_world() -> list[tuple[list[dict], dict, Path]]:
    """For each GPU count measured, the newest run that measured it; a run chosen for several counts appears once
    with those counts' rows. Oldest run first."""
    runs = _overlap_runs()

    def world(row: dict, meta: dict):
        return row.get("world", meta.get("world_size"))

    chosen: dict[Path, tuple[str, set, dict, list[dict]]] = {}
    for w in sorted({world(r, m) for _, _, rows, m in runs for r in rows} - {None}, key=str):
        date, path, _, meta = _newest([run for run in runs if any(world(r, run[3]) == w for r in run[2])])
        chosen.setdefault(path, (date, set(), meta, next(run[2] for run in runs if run[1] == path)))[1].add(w)
    out = []
    for path, (_, worlds, meta, rows) in sorted(chosen.items(), key=lambda pc: pc[1][0]):
        label = " and ".join(str(w) for w in sorted(worlds, key=str))
        out.append(([r for r in rows if world(r, meta) in worlds], {**meta, "world_size": label}, path))
    return out


def overlap_table() -> list[str]:
    out, legends = [], []
    for rows, meta, path in overlap_runs_per_world():
        table = _overlap_table(rows, meta, path)
        out += table[:-2]  # the table; its legend once, after the last table, where every table's legend is one
        legends.append(table[-2:])
    if legends:
        out += legends[-1] if all(leg == legends[-1] for leg in legends) else [line for leg in legends for line in leg]
    return out


def _overlap_table(rows: list[dict], meta: dict, path: Path) -> list[str]:
    world = meta.get("world_size") or (rows[0].get("world_size") if rows else "?")
    shape = rows[0] if rows else {}
    out = [f"**Phase 10 — {world}× {meta.get('device', '?')}** (one host, NCCL), torch {meta.get('torch', '?')}, "
           f"measured {meta.get('date', '?')}, {_link(path)}: a training step of {shape.get('layers')} layers, "
           f"d {shape.get('dim')}, {shape.get('batch')} tokens per rank, bf16.", ""]  # fmt: skip
    gpus = "world" in shape  # a run over several world sizes: a GPUs column
    out.append(f"|{' GPUs |' if gpus else ''} step | variant | step ms | NCCL ms | exposed ms |")
    out.append(f"|{'---|' if gpus else ''}---|---|---|---|---|")
    last = None
    for r in rows:
        name = VARIANTS.get(r["variant"], (r["variant"], ""))[0]
        key = (r.get("world"), r["step"])
        step = STEPS.get(r["step"], r["step"]) if key != last else ""
        world = (f" {r['world']} |" if key != last else " |") if gpus else ""
        last = key
        out.append(
            f"|{world} {step} | {name} | {r['step_ms']:.2f} | {r.get('comm_ms', 0):.2f} | {r.get('exposed_ms', 0):.2f} |"
        )
    out.append("")
    out.append(
        "The variants: "
        + "; ".join(f"*{VARIANTS[v][0]}*: {VARIANTS[v][1]}" for v in VARIANTS if any(r["variant"] == v for r in rows))
        + ". "  # fmt: skip
        + (
            '"ours" and "fusion" differ in what runs: "ours" is our *order* of an uncompiled graph, "fusion" '
            "our *compiler* without that order. "
            if any(r["variant"] == "ours" for r in rows)
            else ""
        )
        + "NCCL ms is torch.profiler's time in NCCL kernels, exposed ms the part of it no compute kernel overlaps."
    )
    out.append("")
    return out


def cpu_table() -> list[str]:
    """The newest CPU suite file that timed ``fusion`` and Inductor: every row of it, with its CPU and threads."""
    found = [
        (str(meta.get("date", "")), path, doc, meta)
        for path, doc, meta in _suite_docs("cpu-*.json")
        if meta.get("device") == "cpu"
        and doc.get("models")
        and all(
            b in (doc.get("meta", {}).get("backends") or meta.get("backends") or []) for b in ("fusion", "inductor")
        )
    ]
    if not found:
        return []
    date, path, doc, meta = max(found, key=lambda t: (t[0], t[1].name))
    rows = [r for r in doc["models"] if r.get("status", "ok") == "ok" and "eager" in r["backends"]]
    out = [
        f"**CPU model suite — {meta.get('cpu_model', '?')}, {meta.get('threads', '?')} thread(s)**, torch "
        f"{meta.get('torch_version', '?')}, float32, batch 1 (text models: small configs, 128 tokens), C kernels "
        f"from {str(meta.get('c_compiler', '?')).split(' (')[0]}, measured {date[:10]}, {_link(path)}:",
        "",
        "| model | eager | fusion | Inductor (C++) | first call, s, caches empty (fusion / Inductor) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cell = {n: (r["backends"][n], None) for n in ("fusion", "inductor") if n in r["backends"]}
        out.append(f"| {r['model']} | {r['backends']['eager']['median_s'] * 1e3:.2f} ms | {_ratio(cell.get('fusion'))} "
                   f"| {_ratio(cell.get('inductor'))} | {_first({'backends': cell})} |")  # fmt: skip
    geo = [
        _geomean([r["backends"][n]["speedup_vs_eager"] for r in rows if n in r["backends"]])
        for n in ("fusion", "inductor")
    ]
    out += [f"| **geomean ({len(rows)})** | | {geo[0]} | {geo[1]} | |", ""]
    return out


def block() -> str:
    files = suite_files()
    lines: list[str] = []
    infer, train = card_rows(files, train=False), card_rows(files, train=True)
    for card in sorted(set(infer) | set(train)):
        if card in infer:
            lines += _table(card, infer[card], BACKENDS, HEADERS, "Model suite, inference")
        if card in train:
            lines += _table(card, train[card], TRAIN_BACKENDS, ["fusion", "Inductor"], "Training steps")
    lines += cpu_table()
    lines += overlap_table()
    lines.append("Speed-ups are against eager in the same process (median wall time, the backends of a model "
                 "interleaved; CUDA graphs off unless named). Hosts differ between dates: compare within a row.")  # fmt: skip
    return "\n".join(lines)


def splice(text: str, new: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no results markers: put {BEGIN} and {END} where the block goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{new}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the README's block is stale")
    ap.add_argument("--print", action="store_true", help="print the block only")
    ap.add_argument("--readme", default=str(README), help="the file holding the markers (default README.md)")
    args = ap.parse_args(argv)
    new = block()
    if args.print:
        print(new)
        return 0
    path = Path(args.readme)
    text = path.read_text()
    updated = splice(text, new)
    if args.check:
        if updated != text:
            print(f"{path.name}'s results block is stale: run python3 scripts/results_table.py", file=sys.stderr)
            return 1
        print(f"{path.name}'s results block matches scripts/results/")
        return 0
    path.write_text(updated)
    print(f"wrote the results block of {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
