"""Python's frame-stack chunks kept for reuse: a compiled graph's calls cost the same at every depth of the caller.

CPython 3.11+ keeps the frames of Python functions on a per-thread stack made of chunks: 16 KiB, or the next power of
two for a frame that needs more. A call that finds no room left in the current chunk maps a fresh one
(``_PyObject_VirtualAlloc``: ``mmap``), and the chunk is unmapped again as soon as the frame at its base returns. A
compiled graph's forward is one large frame (a local per value of the graph) that calls Python code hundreds of
times in a row: our launchers. Where that frame happens to end just short of its chunk's end (it depends only on how
deep the caller's stack is), every one of those calls maps a fresh chunk, takes page faults on it and unmaps it.

Found on H200 hosts (2026-11-29, ``scripts/gpu_fault_probe.py``): EfficientNet-B0's forward, called from torch's
``Timer``, took 81-145 minor page faults and 4.6-10.3 ms of CPU a call; the same function from a plain loop on the
same hosts, no faults and 2.8-6.6 ms. With freed chunks kept, no faults in any way of calling, and the suite's row
went from 0.67-0.82 of Inductor's speed to 1.10. Inductor's calls happened not to sit on a boundary there.

:func:`keep` installs an arena allocator through ``PyObject_SetArenaAllocator`` (the hook CPython documents for it)
that keeps up to :data:`KEEP` freed regions of at most :data:`MAX_BYTES` and hands them out again, so a chunk
crossed on every call is mapped once. Python's object arenas (1 MiB) and anything larger go straight to the
allocator it wraps: Python gives memory back to the OS as before, less at most 1 MiB. It is process-wide (every
backend in the process gains, which keeps comparisons fair), installed once, when the first graph is compiled;
``FUSION_KEEP_STACK_CHUNKS=0`` leaves Python's allocator alone. It needs a C compiler and Python's headers; where
either is missing nothing changes and :func:`status` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

__all__ = ["KEEP", "MAX_BYTES", "keep", "status", "stats"]

KEEP = 8  # freed regions kept at most
MAX_BYTES = 128 * 1024  # the largest region kept: stack chunks are 16-128 KiB, Python's object arenas 1 MiB

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

static PyObjectArenaAllocator wrapped;
static void *kept[KEEP];
static size_t kept_bytes[KEEP];
static int n_kept;
static long reused, mapped;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* sub-interpreters with their own GIL share this */

static void *alloc_region(void *ctx, size_t size) {
    (void)ctx;
    if (size <= MAX_BYTES) {
        pthread_mutex_lock(&lock);
        for (int i = n_kept - 1; i >= 0; i--) {
            if (kept_bytes[i] == size) {
                void *p = kept[i];
                n_kept--;
                kept[i] = kept[n_kept];
                kept_bytes[i] = kept_bytes[n_kept];
                reused++;
                pthread_mutex_unlock(&lock);
                return p;
            }
        }
        mapped++;
        pthread_mutex_unlock(&lock);
    }
    return wrapped.alloc(wrapped.ctx, size);
}

static void free_region(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (ptr != NULL && size <= MAX_BYTES) {
        pthread_mutex_lock(&lock);
        if (n_kept < KEEP) {
            kept[n_kept] = ptr;
            kept_bytes[n_kept] = size;
            n_kept++;
            pthread_mutex_unlock(&lock);
            return;
        }
        pthread_mutex_unlock(&lock);
    }
    wrapped.free(wrapped.ctx, ptr, size);
}

int fusion_keep_chunks(void) {  /* 1: installed now; 0: it already was */
    static int done;
    if (done) return 0;
    PyObject_GetArenaAllocator(&wrapped);
    PyObjectArenaAllocator mine = {NULL, alloc_region, free_region};
    PyObject_SetArenaAllocator(&mine);
    done = 1;
    return 1;
}

long fusion_chunks_reused(void) { return reused; }
long fusion_chunks_mapped(void) { return mapped; }
"""

_LOCK = threading.Lock()
_STATE: dict = {"lib": None, "status": "not installed yet (no graph compiled)"}


def _source(keep: int = KEEP, max_bytes: int = MAX_BYTES) -> str:
    return f"#define KEEP {keep}\n#define MAX_BYTES {max_bytes}\n" + SOURCE


def _build(keep: int = KEEP, max_bytes: int = MAX_BYTES) -> ctypes.PyDLL:
    """The library (keeping ``keep`` regions of at most ``max_bytes``: ``scripts/gpu_fault_probe.py`` builds one that
    keeps any size), compiled once into the C kernels' cache (keyed by source, Python version and headers)."""
    from fusion.kernels import c_runtime

    cc = c_runtime._find()
    if cc is None:
        raise RuntimeError("no C compiler found (looked at $CC, cc, gcc, clang)")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"Python's headers are missing ({include}/Python.h)")
    flags = ["-O2", "-shared", "-fPIC", f"-I{include}"]
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]  # Python's symbols come from the running interpreter
    source = _source(keep, max_bytes)
    key = "\0".join((source, sys.version, include, cc, *flags))
    path = c_runtime._cache() / f"stack_chunks_{hashlib.sha256(key.encode()).hexdigest()[:20]}.so"

    def build(c_file: Path, out: Path) -> None:
        done = subprocess.run([cc, *flags, str(c_file), "-o", str(out)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr[-500:]}")

    c_runtime.build_once(path, source, build)
    lib = ctypes.PyDLL(str(path))  # PyDLL: called with the GIL held, as the allocator requires
    lib.fusion_chunks_reused.restype = ctypes.c_long
    lib.fusion_chunks_mapped.restype = ctypes.c_long
    return lib


def keep() -> bool:
    """Install the allocator that keeps freed stack chunks (once per process); True where it is installed. Never
    raises: where it cannot be installed, :func:`status` says why and Python's allocator stays as it was."""
    if _STATE["lib"] is not None:
        return True
    with _LOCK:
        if _STATE["lib"] is not None:
            return True
        if os.environ.get("FUSION_KEEP_STACK_CHUNKS", "1") == "0":
            _STATE["status"] = "off (FUSION_KEEP_STACK_CHUNKS=0)"
            return False
        if sys.version_info < (3, 11) or sys.platform == "win32" or sysconfig.get_config_var("Py_GIL_DISABLED"):
            _STATE["status"] = "not needed or not supported on this Python (3.11+, not Windows, not free-threaded)"
            return False
        try:
            lib = _build()
            lib.fusion_keep_chunks()
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            _STATE["status"] = f"not installed: {e}"
            return False
        _STATE["lib"] = lib
        _STATE["status"] = f"kept (up to {KEEP} freed regions of at most {MAX_BYTES // 1024} KiB)"
        return True


def status() -> str:
    """What :func:`keep` did in this process, in words."""
    return _STATE["status"]


def stats() -> dict[str, int]:
    """``{"reused": regions handed out again, "mapped": regions of at most MAX_BYTES mapped}`` (zeros where not
    installed)."""
    lib = _STATE["lib"]
    if lib is None:
        return {"reused": 0, "mapped": 0}
    return {"reused": lib.fusion_chunks_reused(), "mapped": lib.fusion_chunks_mapped()}
