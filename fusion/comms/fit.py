"""Fitting the collective cost model to measured times: ``time = latency + size · factor / bus bandwidth``.

``scripts/gpu_overlap.py`` times all_reduce, all_gather and reduce_scatter from 1 MiB to 1 GiB (back to back, as
nccl-tests does, so a time is the GPU's, not the host's sync). An ordinary least-squares line through those points
is dominated by the largest sizes: the 2xH200 run of 2026-11-23 fitted 76 µs of latency that way and predicted a
1 MiB all_reduce 30 % off. Here each point weighs ``1 / time²``: the fit minimises *relative* error, which is what
"predicts within 25 %" asks of it at every size.

One line is not enough from 1 MiB up: NCCL picks a protocol (LL, LL128, Simple) and a channel count per size, and
the times bend, even fall, where it switches (4xH200, 2026-11-26: a 4 MiB all_reduce took 85 µs, an 8 MiB one 60 µs;
a reduce_scatter 73 µs at 2 and 4 MiB, 41 µs at 8). One line missed by up to 52 %. :func:`fit_bands` cuts the sizes
into at most three contiguous bands (three protocols), one relative least-squares line per band, the fewest bands
whose worst error is within :data:`GOOD` (10 %). The largest band's line (Simple, large messages) is what
``fusion/comms/scale.py`` extrapolates from.

A size is measured on every rank (back to back, CUDA events); a rank that launched first also times its wait for
the last, so the measured time is the *least* over ranks (:func:`rows_over_ranks`).

>>> f = fit_alpha_beta([(1e6, 2e-5 + 1e6 / 2e11), (1e8, 2e-5 + 1e8 / 2e11), (1e9, 2e-5 + 1e9 / 2e11)])
>>> round(f["latency_us"], 3), round(f["busbw_gbps"], 3)
(20.0, 200.0)
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from fusion.comms.cost import CostModel

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
SHORT = {"all_reduce": "all-reduce", "all_gather_into_tensor": "all-gather", "reduce_scatter_tensor": "reduce-scatter"}
MAX_BANDS = 3  # NCCL's protocols: LL, LL128, Simple
GOOD = 0.10  # the fewest bands whose worst relative error is within this


def fit_alpha_beta(points: list[tuple[float, float]]) -> dict:
    """``points``: (bytes · ring factor, seconds). Weighted least squares of ``t = a + x / b`` with weights 1/t²:
    latency ``a`` (µs), bus bandwidth ``b`` (GB/s), and the largest relative error of the fit over the points."""
    if len(points) < 2:
        raise ValueError(f"a latency/bandwidth fit needs at least 2 sizes, got {len(points)}")
    w = [1.0 / t**2 for _, t in points]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, points, strict=True))
    sy = sum(wi * t for wi, (_, t) in zip(w, points, strict=True))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points, strict=True))
    sxy = sum(wi * x * t for wi, (x, t) in zip(w, points, strict=True))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    latency = (sy - slope * sx) / sw
    if slope <= 0:  # flat or falling times (noise at a few sizes): no bandwidth to speak of
        raise ValueError("the measured times do not grow with size: no bus bandwidth can be fitted")
    latency = max(latency, 0.0)
    worst = max(abs((latency + x * slope) / t - 1) for x, t in points)
    return {"latency_us": latency * 1e6, "busbw_gbps": 1 / slope / 1e9, "max_rel_err": worst}


def _band_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(latency s, seconds per byte) of one band: a line, or flat (one time: the least relative squares) where the
    times barely grow (a flat fit within GOOD / 2) or fall."""
    flat = sum(1 / t for _, t in points) / sum(1 / t**2 for _, t in points)
    if len(points) >= 2 and max(abs(flat / t - 1) for _, t in points) > GOOD / 2:
        try:
            f = fit_alpha_beta(points)
            return f["latency_us"] * 1e-6, 1 / (f["busbw_gbps"] * 1e9)
        except ValueError:
            pass
    return flat, 0.0


def fit_bands(points: list[tuple[float, float]], max_bands: int = MAX_BANDS, good: float = GOOD) -> list[dict]:
    """``points``: (bytes · ring factor, seconds), any order. Contiguous size bands, each its own line (relative
    least squares): the fewest bands (up to ``max_bands``) whose worst error is within ``good``, else the best of
    ``max_bands``. Each band: first and last x, latency µs, bus GB/s (0: flat), its worst error."""
    pts = sorted(points)
    best: tuple[float, list] | None = None
    for k in range(1, min(max_bands, len(pts)) + 1):
        for cuts in itertools.combinations(range(1, len(pts)), k - 1):
            edges = [0, *cuts, len(pts)]
            bands = []
            for lo, hi in zip(edges, edges[1:], strict=False):
                part = pts[lo:hi]
                a, s = _band_line(part)
                worst = max(abs((a + x * s) / t - 1) for x, t in part)
                bands.append({"x_lo": part[0][0], "x_hi": part[-1][0], "latency_us": a * 1e6,
                              "busbw_gbps": 1 / s / 1e9 if s else 0.0, "max_rel_err": worst})  # fmt: skip
            err = max(b["max_rel_err"] for b in bands)
            if best is None or err < best[0] - 1e-12:
                best = (err, bands)
        if best[0] <= good:
            break
    return best[1]


def fit_rows(rows: list[dict], world: int, key: str = "measured_ms") -> dict:
    """Per collective, the fit of ``rows`` (``{"op", "bytes", key}``, as the script writes them): ``bands`` (sizes
    in bytes of the full buffer), ``line`` (one latency/bandwidth line over all sizes), and the largest band's
    ``latency_us`` and ``busbw_gbps`` (Simple: what scale.py extrapolates); ``max_rel_err`` of the bands."""
    factor = CostModel(world_size=world).bus_factor
    out = {}
    for op in OPS:
        pts = [(r["bytes"] * factor(op), r[key] * 1e-3) for r in rows if r["op"] == op and r.get(key)]
        if len(pts) < 2:
            continue
        try:
            line = fit_alpha_beta(pts)
        except ValueError as e:  # times that do not grow (a dry run's few sizes): flat bands only
            line = {"error": str(e)}
        bands = fit_bands(pts)
        for b in bands:  # back from bus bytes to the full buffer's bytes
            b["bytes_lo"], b["bytes_hi"] = round(b.pop("x_lo") / factor(op)), round(b.pop("x_hi") / factor(op))
        top = bands[-1] if bands[-1]["busbw_gbps"] or "error" in line else line
        out[op] = {"latency_us": top["latency_us"], "busbw_gbps": top["busbw_gbps"],
                   "max_rel_err": max(b["max_rel_err"] for b in bands), "bands": bands, "line": line}  # fmt: skip
    return out


def rows_over_ranks(ranks: list[list[dict]], key: str = "measured_ms") -> list[dict]:
    """One row per (op, bytes): rank 0's, its ``key`` the least over ranks (``key + "_ranks"``: every rank's)."""
    out = []
    for i, row in enumerate(ranks[0]):
        times = [r[i][key] for r in ranks if i < len(r) and r[i].get(key) and r[i]["op"] == row["op"]]
        out.append({**row, key: min(times), f"{key}_ranks": times} if times else dict(row))
    return out


def model_from_fit(world: int, fit: dict, base: CostModel | None = None, source: str = "") -> CostModel:
    """A cost model whose collectives are ``fit``'s, per op (``CostModel.per_op``); compute figures from ``base``."""
    base = base or CostModel(world_size=world)
    per_op = tuple((op, f["latency_us"], f["busbw_gbps"]) for op, f in fit.items() if f.get("busbw_gbps"))
    bands = tuple((op, b["bytes_lo"], b["bytes_hi"], b["latency_us"], b["busbw_gbps"]) for op, f in fit.items()
                  for b in f.get("bands", ()))  # fmt: skip
    ar = dict(fit.get("all_reduce") or {})
    return CostModel(world_size=world, matmul_tflops=base.matmul_tflops, bandwidth_gbps=base.bandwidth_gbps,
                     bus_gbps=ar.get("busbw_gbps") or base.bus_gbps, latency_us=ar.get("latency_us", base.latency_us),
                     per_op=per_op, bands=bands, source=source or "fitted to measured collectives")  # fmt: skip


def line_model(world: int, fit: dict) -> CostModel:
    """The one-line fit per collective (what the model was before size bands), for comparison."""
    per_op = tuple((op, f["line"]["latency_us"], f["line"]["busbw_gbps"]) for op, f in fit.items()
                   if "latency_us" in f.get("line", {}))  # fmt: skip
    return CostModel(world_size=world, per_op=per_op, source="one latency/bandwidth line per collective")


def prediction_rows(rows: list[dict], model: CostModel, key: str = "measured_ms") -> list[dict]:
    """Measured against predicted per size: {op, MiB, measured_us, predicted_us, error} (error = predicted/measured-1)."""
    out = []
    for r in rows:
        if not r.get(key):
            continue
        pred = model.collective_of(r["op"], r["bytes"]).ms
        out.append({"op": r["op"], "MiB": r["bytes"] / 2**20, "measured_us": r[key] * 1e3,
                    "predicted_us": pred * 1e3, "error": pred / r[key] - 1})  # fmt: skip
    return out


def newest_measurement(results: str | Path | None = None) -> dict | None:
    """The newest measured collectives in ``scripts/results``: ``*-overlap-collectives.json`` (written by
    ``scripts/gpu_overlap.py``), else an older ``*-overlap-x<n>.json`` (issue 22's run: one call at a time,
    host-synced); read by :func:`load_measurement`. None where none."""
    root = Path(results) if results else Path(__file__).resolve().parents[2] / "scripts" / "results"
    if not root.is_dir():
        return None
    files = sorted(root.glob("*-overlap-collectives.json")) or sorted(
        f for f in root.glob("*-overlap-x*.json") if "compiled" not in f.name
    )
    return load_measurement(files[-1]) if files else None


def load_measurement(path: str | Path) -> dict | None:
    """One run's collectives, refitted here (this module's fit, whatever the file holds): a ``-collectives.json``
    (per world size its rows; where the run's per-rank ``-x<n>.json`` sits beside it, the least over its ranks), or
    a per-rank ``-overlap-x<n>.json`` alone (the least over its ranks). None where it holds no rows."""
    path = Path(path)
    data = json.loads(path.read_text())
    if path.name.endswith("-overlap-collectives.json"):
        found = data
        stamp = path.name.removesuffix("-overlap-collectives.json")
        for world, entry in found.get("worlds", {}).items():
            per_rank = path.with_name(f"{stamp}-overlap-x{world}.json")
            if per_rank.exists() and not any("measured_ms_ranks" in r for r in entry["rows"]):
                ranks = [r["collectives"] for r in json.loads(per_rank.read_text())["ranks"] if r.get("collectives")]
                entry["rows"] = rows_over_ranks(ranks) if ranks else entry["rows"]
    else:
        ranks = [r for r in data["ranks"] if r.get("collectives")]
        if not ranks:
            return None
        rank0 = ranks[0]
        found = {"device": rank0.get("device"), "torch": rank0.get("torch"), "date": rank0.get("date"),
                 "timing": "one call at a time, host-synced (issue 22's script)",
                 "worlds": {str(rank0["world_size"]): {"rows": rows_over_ranks([r["collectives"] for r in ranks]),
                                                       "calibration": rank0.get("calibration", {})}}}  # fmt: skip
    for world, entry in found.get("worlds", {}).items():
        entry["fit"] = fit_rows(entry["rows"], int(world))
    found["worlds"] = {w: e for w, e in found.get("worlds", {}).items() if e["rows"]}
    return found | {"file": path.name} if found["worlds"] else None


def measured_compute(entry: dict) -> CostModel:
    """The stated compute figures, replaced by a world entry's measured ones (matmul peak, copy bandwidth) if any."""
    cal, base = entry.get("calibration") or {}, CostModel()
    return CostModel(matmul_tflops=cal.get("matmul_tflops") or base.matmul_tflops,
                     bandwidth_gbps=cal.get("copy_gbps") or base.bandwidth_gbps)  # fmt: skip


def fit_table(measurement: dict) -> tuple[list[tuple], list[str]]:
    """Rows for the lesson: per world size and collective, the fitted bands and the worst error over the sizes, for
    the bands, for one line through all sizes (the model before bands) and for the stated defaults."""
    rows = []
    for world, entry in sorted(measurement["worlds"].items(), key=lambda kv: int(kv[0])):
        world = int(world)
        models = (model_from_fit(world, entry["fit"]), line_model(world, entry["fit"]), CostModel(world_size=world))
        for op in OPS:
            mine = [r for r in entry["rows"] if r["op"] == op]
            if not mine or "latency_us" not in entry["fit"].get(op, {}):
                continue
            bands = "; ".join(f"{b['bytes_hi'] / 2**20:g} MiB: {b['latency_us']:.0f} µs" +
                              (f" + {b['busbw_gbps']:.0f} GB/s" if b["busbw_gbps"] else " flat")
                              for b in entry["fit"][op]["bands"])  # fmt: skip
            worst = [max(prediction_rows(mine, m), key=lambda p: abs(p["error"])) for m in models]
            rows.append(
                (world, SHORT[op], "up to " + bands, *(f"{w['error']:+.0%} at {w['MiB']:g} MiB" for w in worst))
            )
    return rows, ["GPUs", "collective", "bands (up to size: latency + bus bandwidth)", "bands: worst",
                  "one line: worst", "stated defaults: worst"]  # fmt: skip


def size_table(measurement: dict) -> tuple[list[tuple], list[str]]:
    """Predicted (bands) against measured µs at every measured size, one column per world size and collective."""
    columns, sizes = [], set()
    for world, entry in sorted(measurement["worlds"].items(), key=lambda kv: int(kv[0])):
        model = model_from_fit(int(world), entry["fit"])
        for op in OPS:
            got = {round(p["MiB"], 3): p for p in prediction_rows([r for r in entry["rows"] if r["op"] == op], model)}
            if got:
                columns.append((f"x{world} {SHORT[op]}", got))
                sizes |= set(got)
    rows = [(f"{mib:g}", *(f"{c[mib]['measured_us']:.0f} / {c[mib]['predicted_us']:.0f} {c[mib]['error']:+.0%}"
                           if mib in c else "-" for _, c in columns)) for mib in sorted(sizes)]  # fmt: skip
    return rows, ["MiB", *(name for name, _ in columns)]
