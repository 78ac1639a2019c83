"""A graph's C kernels compiled together: one compiler process per core, each a bundle of kernels, the prelude once.

Compiling a kernel alone (``c_runtime.load``) is one compiler process: its start, the prelude's parse, the kernel's
``-O3`` code generation, the link. Measured on the course's 2-core CPU (gcc 12, other jobs running; scripts/results/
cpu-2026-11-27-c-compile.log): ~50 ms of CPU a kernel, of which ~26 ms the process and its link (an empty file),
~6 ms the prelude and ~18 ms the kernel's own code; EfficientNet-B0's 48 kernels took 2.6 s of CPU one by one, 1.0 s
as one translation unit, 1.1 s as two side by side (1.7 s wall, against 6.0 s). So a compiled graph hands its
kernels here before its first call (``fusion.kernels.precompile.precompile_c``):

* each kernel is named by its code (``c_runtime.named``) and keyed as alone (``c_runtime.library_path``: its source,
  the flags, the compiler's version, the CPU); the ones already on disk are loaded, never compiled again;
* the missing ones are locked (each its own ``.lock``, taken without waiting: a kernel another process is compiling
  is left to it, and ``c_runtime.load`` waits for its library), split into one bundle per worker (balanced by source
  size), each bundle the prelude then every kernel's function, compiled by its own compiler process (threads), and
  the bundle's library hard-linked (copied where links fail) under each kernel's own name, so the per-kernel disk
  cache holds it as if it had been compiled alone;
* a bundle the compiler refuses is compiled again kernel by kernel: the others still compile, and the one that fails
  raises its own error, naming it, at its first call (``c_runtime.kernel_for``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from fusion.kernels import c_runtime
from fusion.kernels.c_prelude import PRELUDE

MIN_PER_BUNDLE = 4  # a compiler process costs ~30 ms before its first kernel (~20-40 ms each): fewer, one bundle


def _chunks(todo: list[tuple[str, str, Path]], workers: int) -> list[list[tuple[str, str, Path]]]:
    """``todo`` in at most ``workers`` bundles of about equal source size (largest first, onto the lightest), each of
    at least :data:`MIN_PER_BUNDLE` kernels where there are that many."""
    bins: list[list[tuple[str, str, Path]]] = [[] for _ in range(max(1, min(workers, len(todo) // MIN_PER_BUNDLE)))]
    sizes = [0] * len(bins)
    for item in sorted(todo, key=lambda t: -len(t[1])):
        i = sizes.index(min(sizes))
        bins[i].append(item)
        sizes[i] += len(item[1])
    return [b for b in bins if b]


def _body(source: str) -> str:
    return source[len(PRELUDE) :] if source.startswith(PRELUDE) else source


def _place(tmp: Path, path: Path) -> None:
    """The bundle's library under a kernel's own name, whole or not at all: a hard link, else a copy renamed."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:
        copy = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.copy")
        shutil.copyfile(tmp, copy)
        os.replace(copy, path)


def _compile_bundle(bundle: list[tuple[str, str, Path]]) -> str:
    """Compile ``bundle`` ((code, source, path) each) as one library placed under every path; '' or the error."""
    if len(bundle) == 1:
        text = bundle[0][1]
    elif all(source.startswith(PRELUDE) for _, source, _ in bundle):
        text = PRELUDE + "".join(_body(source) for _, source, _ in bundle)
    else:
        return "a kernel's source does not begin with the prelude"
    first = bundle[0][2]
    digest = hashlib.sha256("\0".join(sorted(str(p) for _, _, p in bundle)).encode()).hexdigest()[:20]
    stem = f"bundle_{digest}.{os.getpid()}.{threading.get_ident()}"
    c_file, tmp = first.parent / f"{stem}.c", first.parent / f"{stem}.tmp"
    try:
        c_file.write_text(text)
        c_runtime.run_compiler(c_file, tmp, f"{len(bundle)} kernels")
        for _, source, path in bundle:
            path.with_suffix(".c").write_text(source)  # each kernel's own source beside its library, as load writes
            _place(tmp, path)
        return ""
    except Exception as e:  # noqa: BLE001 - the bundle's kernels compile one by one instead
        return f"{type(e).__name__}: {str(e)[:2000]}"
    finally:
        for f in (c_file, tmp):
            with contextlib.suppress(OSError):
                f.unlink()


def compile_kernels(kernels: Sequence[object], workers: int | None = None) -> tuple[list, dict[str, object]]:
    """The C kernels (``c_runtime.CKernel``) of ``kernels`` (kernel IR records of one graph), the missing ones compiled
    together in ``workers`` bundles (default: one per core), and what happened: ``{"kernels": distinct codes,
    "compiled": kernels compiled here, "bundles": compiler processes, "seconds": wall time, "failed": [reasons]}``.
    A kernel that failed to compile or load is None in the list (``c_runtime.kernel_for`` compiles it alone, which
    raises or reports its error)."""
    start = time.perf_counter()
    named, failed = [], []  # (kernel, code, source, renamed, path); code None where rendering failed
    for k in kernels:
        try:
            code, source, renamed = c_runtime.named(k)
            named.append((k, code, source, renamed, c_runtime.library_path(renamed, code)))
        except c_runtime.CompilerMissing:
            raise
        except Exception as e:  # noqa: BLE001 - a renderer bug: its first call renders it again and says so
            failed.append(f"{k.name}: rendering: {type(e).__name__}: {str(e)[:300]}")
            named.append((k, None, "", "", None))
    distinct = {code: (renamed, path) for _, code, _, renamed, path in named if code is not None}
    if not workers:
        workers = c_runtime.cores()
    compiled = bundles = 0
    with c_runtime._LOCK:  # this process's loads wait; other processes see the kernels' file locks
        loaded = set()
        with contextlib.ExitStack() as held:
            todo = []
            for code, (renamed, path) in sorted(distinct.items()):
                if str(path) in c_runtime._LIBS:
                    loaded.add(code)
                elif not path.exists() and c_runtime.try_lock(path.with_suffix(".lock"), held) and not path.exists():
                    todo.append((code, renamed, path))
            parts = _chunks(todo, workers)
            with concurrent.futures.ThreadPoolExecutor(max(1, len(parts))) as pool:
                errors = list(pool.map(_compile_bundle, parts))
            retry, refused = [], set()  # a bundle's kernels to compile one by one; codes a compile refused
            for part, error in zip(parts, errors, strict=True):
                bundles += 1
                if error:
                    failed.append(f"a bundle of {len(part)} kernels: {error.splitlines()[0]}")
                    refused.update(code for code, _, _ in part)
                    retry += part if len(part) > 1 else []  # one kernel alone: its first call says why
                else:
                    compiled += len(part)
                    c_runtime.STATS["compiled"] += len(part)
                    loaded.update(code for code, _, _ in part)
                    for _, _, path in part:
                        c_runtime.open_library(path)
    for code, renamed, _ in retry:  # one by one, locks released (load takes each again): the others still compile
        try:
            c_runtime.load(renamed, code)
            compiled += 1
            loaded.add(code)
        except Exception as e:  # noqa: BLE001 - said again, naming the kernel, at its first call
            failed.append(f"kernel {' = '.join(k.name for k, c, *_ in named if c == code)}: {str(e)[:300]}")
    out = []
    for k, code, source, renamed, path in named:
        if code is None or (code in refused and code not in loaded):  # in failed; its first call tries it alone
            out.append(None)
            continue
        try:
            if code in loaded:
                with c_runtime._LOCK:
                    fn = c_runtime.function(c_runtime.open_library(path), code)
            else:  # on disk before (a hit), or another process was compiling it (load waits for its lock)
                fn = c_runtime.load(renamed, code)
            out.append(c_runtime.CKernel(fn, k.name, source, len(k.buffers)))
        except Exception as e:  # noqa: BLE001 - compiled alone at its first call, which raises or reports it
            failed.append(f"{k.name}: {type(e).__name__}: {str(e)[:300]}")
            out.append(None)
    summary = {"kernels": len(distinct), "compiled": compiled, "bundles": bundles,
               "seconds": time.perf_counter() - start, "failed": failed}  # fmt: skip
    return out, summary
