"""Where a compiled model's calls take page faults, and under which way of calling. The lead, from
``gpu_timer_split_probe.py`` (H200, 2026-11-29): under torch's Timer each of ``fusion``'s EfficientNet-B0 calls took
145 minor page faults and ~0.7 ms of system time, in a plain loop none; Inductor's took 2 either way. What this probe
found (``results/h200-2026-11-29-0555-stack-chunks/faults_*``): the faults follow the depth the model is called from,
not the collector or CUDA events. They fall on the Python calls the graph's forward makes, and they vanish with freed
arenas kept: CPython's frame-stack chunks, mapped and unmapped on every call at a chunk boundary
(``fusion/kernels/stack_chunks.py`` now keeps them; ``FUSION_KEEP_STACK_CHUNKS=0`` to see the faults again).

    PYTHONPATH=.:scripts python3 scripts/gpu_fault_probe.py efficientnet_b0        (on the lent GPU, inside the suite)
    PYTHONPATH=.:scripts python3 scripts/gpu_fault_probe.py --dry-run resnet18     (CPU, tiny: rehearse it)

Inside the suite's own process, just before its timer, per compiled backend, 3 rounds of these ways (12 calls each
unless said): torch's ``Timer.timeit(10)``, with and without CUDA events around each call; the suite's
``blocked_autorange(0.04)``; the standard library's ``timeit`` (alone, with events, with events and the collector on as
its setup); twelve one-call ``timeit`` blocks; plain loops (the collector on or off, events, a synchronisation around
each call). Per way: minor faults, system ms and thread CPU ms a call (``getrusage(RUSAGE_THREAD)``); forks, new pids
on the host, resident pages gained and Python's object arenas allocated and given back; glibc's ``mallinfo2`` before
and after. Then, for the first three ways that fault, one run again under ``sys.setprofile``: the faults between two
profile events, charged to the function the event names (a C function with the line that calls it, Python code by
file:line of its definition). Then everything again with a C arena allocator that keeps freed regions
(:func:`install_arena_cache`), and the suite's row after it. ``gpu_measure.sh faults`` runs it with
``FUSION_KEEP_STACK_CHUNKS=0``: ``fusion``'s own fix would otherwise hide what the first pass looks for.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys
import time
import timeit
from collections import Counter

import torch
import torch.utils.benchmark as tbench

WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
CALLS = 12


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


def mallinfo() -> dict:
    """glibc's heap statistics (empty where there is no ``mallinfo2``)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        return {}
    m = libc.mallinfo2()
    return {k: getattr(m, k) for k, _ in MallInfo2._fields_}


def faults() -> tuple[int, float, float, int]:
    """(minor faults, system s, thread CPU s, calls so far)."""
    r = resource.getrusage(WHO)
    return r.ru_minflt, r.ru_stime, time.thread_time(), COUNT[0]


COUNT = [0]


def counted(fn):
    def call():
        COUNT[0] += 1
        return fn()

    return call


def with_events(fn):
    """``fn`` with two CUDA timing events recorded around each call, as ``gpu_call_trace.traced`` does."""
    kept: list = []

    def call():
        if len(kept) > 400:
            kept.clear()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        out = fn()
        e1.record()
        kept.append((e0, e1))
        return out

    return call


def ways(fn, clock, sync) -> dict:
    """The ways of calling, as a matrix: the collector off or on, torch's CUDA events around each call or not,
    inside ``timeit``'s machinery or a plain loop, a synchronisation around every call or not."""
    evented = with_events(fn) if torch.cuda.is_available() else fn

    def timer(f, setup: str = "pass"):
        return timeit.Timer("fn()", setup=setup, timer=clock, globals={"fn": f, "gc": gc})

    def torch_timer(f=fn):
        return tbench.Timer("fn()", globals={"fn": f}, timer=clock, num_threads=torch.get_num_threads())

    def autorange():  # the suite's way (min_run_time 0.04): blocks of 1, 10, 100 calls until one is long enough
        torch_timer().blocked_autorange(min_run_time=0.04)

    def loop(f, collector: bool = True, synced: bool = False):
        def run():
            if not collector:
                gc.disable()
            try:
                for _ in range(CALLS):
                    if synced:
                        sync()
                    f()
                    if synced:
                        sync()
            finally:
                gc.enable()

        return run

    return {
        "the suite's autorange": autorange,
        "torch Timer.timeit(10)": lambda: torch_timer().timeit(10),
        "torch Timer, events": lambda: torch_timer(evented).timeit(10),
        "timeit": lambda: timer(fn).timeit(CALLS),
        "timeit, events": lambda: timer(evented).timeit(CALLS),
        "timeit, events, gc on": lambda: timer(evented, "gc.enable()").timeit(CALLS),
        "timeit(1) x 12": lambda: [timer(fn).timeit(1) for _ in range(CALLS)],
        "loop": loop(fn),
        "loop, gc off": loop(fn, collector=False),
        "loop, events": loop(evented),
        "loop, events, gc off": loop(evented, collector=False),
        "loop, synced, gc off": loop(fn, collector=False, synced=True),
        "loop, synced": loop(fn, synced=True),
    }


def forks_and_rss() -> tuple[int, ...]:
    """(forks seen by os.register_at_fork, the newest pid on the host, resident pages, obmalloc arenas allocated and
    reclaimed in all)."""
    try:
        last_pid = int(open("/proc/loadavg").read().split()[4])
        rss = int(open("/proc/self/statm").read().split()[1])
    except (OSError, ValueError, IndexError):
        last_pid = rss = 0
    return FORKS[0], last_pid, rss, *arenas()


def arenas() -> tuple[int, int]:
    """(obmalloc arenas allocated in all, reclaimed in all) from ``sys._debugmallocstats()`` (which writes to fd 2)."""
    import tempfile

    with tempfile.TemporaryFile(mode="w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    found = {}
    for line in text.splitlines():
        if line.startswith("# arenas allocated total") or line.startswith("# arenas reclaimed"):
            found[line.split("=")[0].strip()] = int(line.split("=")[1].replace(",", ""))
    return found.get("# arenas allocated total", -1), found.get("# arenas reclaimed", -1)


def install_arena_cache():
    """Python's freed arenas and stack chunks kept for reuse, whatever their size (up to 16 regions): the allocator of
    ``fusion.kernels.stack_chunks`` built with no size bound. A diagnostic: does region churn cost the calls their
    faults?"""
    from fusion.kernels import stack_chunks

    handle = stack_chunks._build(keep=16, max_bytes=2**62)
    handle.fusion_keep_chunks()
    return handle


FORKS = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: FORKS.__setitem__(0, FORKS[0] + 1))


def where(run) -> Counter:
    """Faults between profile events while ``run()`` runs, by the function an event names."""
    charged: Counter = Counter()
    last = [faults()[0]]

    def hook(frame, event, arg):
        now = resource.getrusage(WHO).ru_minflt
        if now != last[0]:
            if event.startswith("c_"):
                name = getattr(arg, "__qualname__", None) or getattr(arg, "__name__", repr(arg))
                mod = getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__name__
                key = f"{event} {mod}.{name} @ {frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
            else:
                code = frame.f_code
                key = f"{event} {code.co_filename.rsplit('/', 2)[-1]}:{code.co_firstlineno} {code.co_qualname}"
            charged[key] += now - last[0]
            last[0] = now

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return charged


def probe(label: str, fn, sync, rounds: int) -> None:
    fn = counted(fn)

    def clock() -> float:
        sync()
        return time.perf_counter()

    table = ways(fn, clock, sync)
    per: dict = {w: [] for w in table}
    heap: dict = {}
    other: dict = {w: [0, 0, 0, 0, 0] for w in table}
    for _ in range(rounds):
        for w, run in table.items():
            sync()
            m0, (f0, s0, c0, n0), k0 = mallinfo(), faults(), forks_and_rss()
            run()
            sync()
            (f1, s1, c1, n1), m1, k1 = faults(), mallinfo(), forks_and_rss()
            n = max(n1 - n0, 1)
            per[w].append(((f1 - f0) / n, (s1 - s0) * 1e3 / n, (c1 - c0) * 1e3 / n, n))
            heap[w] = (m0, m1)
            other[w] = [a + (y - x) for a, x, y in zip(other[w], k0, k1, strict=True)]
    print(f"\n{label}: per call, each round: minor faults / system ms / thread CPU ms (calls)")
    for w, cells in per.items():
        print(f"  {w:24s} " + "   ".join(f"{f:6.1f} / {s:4.2f} / {c:5.2f} ({n})" for f, s, c, n in cells), flush=True)
    print(
        f"{label}: over all rounds: forks (os.register_at_fork), new pids on the host, resident pages gained, "
        "Python's small-object arenas (1 MiB) allocated / given back"
    )
    for w, (fk, pids, rss, made, freed) in other.items():
        print(f"  {w:24s} {fk:4d} forks  {pids:5d} pids  {rss:+7d} pages  {made:5d} / {freed:5d} arenas", flush=True)
    print(f"{label}: glibc heap in the last round, before -> after (KB; hblks: mmapped chunks)")
    for w, (m0, m1) in heap.items():
        keys = ("arena", "hblks", "hblkhd", "uordblks", "fordblks", "keepcost")
        cells = [f"{k} {m0[k] if k == 'hblks' else m0[k] // 1024}->{m1[k] if k == 'hblks' else m1[k] // 1024}"
                 for k in keys if k in m0]  # fmt: skip
        print(f"  {w:24s} " + ", ".join(cells), flush=True)
    faulting = [w for w, cells in per.items() if max(c[0] for c in cells) >= 5]
    for w in faulting[:3]:
        sync()
        charged = where(table[w])
        sync()
        total = sum(charged.values())
        print(f"{label}, {w}: {total} faults under the profile hook, by function (top 15)")
        for key, n in charged.most_common(15):
            print(f"  {n:6d}  {key}", flush=True)


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    name = next((a for a in argv if not a.startswith("--")), "efficientnet_b0")

    def before(fns, sync):
        print(f"glibc mallopt defaults in force; heap now: {mallinfo()}", flush=True)
        for label, fn in fns.items():
            probe(label, fn, sync, 2 if dry else 3)
        try:
            cache = install_arena_cache()
        except Exception as e:  # noqa: BLE001 - no compiler or headers: say so, go on
            print(f"\narena cache not installed: {type(e).__name__}: {e}", flush=True)
            cache = None
        if cache is not None:
            print("\n=== again, with Python's freed arenas kept for reuse (no munmap/mmap churn)", flush=True)
            for label, fn in fns.items():
                probe(f"{label}, arenas kept", fn, sync, 2 if dry else 3)
            print(f"arenas handed out again from the cache: {cache.fusion_chunks_reused()}", flush=True)
        print("\nthe suite's own timing follows, in this process", flush=True)

    from gpu_suite_probe import suite_keeping

    suite_keeping(name, ["eager", "fusion", "inductor"], dry, before)


if __name__ == "__main__":
    main(sys.argv[1:])
