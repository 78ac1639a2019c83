"""The C runtime: a C source in, a ctypes function out, and which renderer a CPU kernel uses.

* :func:`compiler` — the system compiler (``$CC``, else ``cc``, ``gcc``, ``clang`` on PATH) and its flags, probed
  once: ``-O3 -shared -fPIC -fwrapv`` (integers wrap as torch's do; no fast-math: results match the Triton path),
  ``-march=native`` where it compiles, ``-fopenmp`` where it links (serial kernels otherwise).
* :func:`load` — compile once per (source, flags, compiler version): ``<cache_dir>/c/<name>_<hash>.so``, built under
  a file lock (``fcntl``) into a temporary file and renamed into place, so parallel compiles and test workers never
  load half a library; loaded with ``ctypes``. A compiled graph's missing kernels compile together before its first
  call (``fusion.kernels.c_bundle``: one compiler process per core), each then cached under its own key as here.
* :func:`kernel_for` — a Phase 8 ``KernelPlan``'s kernel IR (``plan.ir``, which ``fusion.compiler.lowering`` fills
  when the graph is compiled: this folder reads the IR, never the lowering), rendered to C (``fusion.kernels.c_render``), compiled, loaded: a :class:`CKernel` called with the launch's tensors.
* :func:`chosen` / :func:`use` — the renderer of CPU kernels: ``options={"renderer": "c" | "triton"}`` on the backend
  (:func:`use` around its code generation), else ``$FUSION_RENDERER``, else :data:`DEFAULT`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from fusion.kernels import c_probes as probes
from fusion.kernels.c_ops import RANGE_FLAG
from fusion.kernels.setting import Setting

RENDERERS = ("c", "triton")
DEFAULT = "c"  # CPU kernels compile from C where a compiler is found; Triton's interpreter otherwise (said once)
RENDERER = Setting("renderer", "FUSION_RENDERER", RENDERERS, DEFAULT, "renderer")
# What load() and c_bundle did, for tests and the lesson: kernels compiled, found on disk (compiled by an earlier
# graph or process), libraries loaded; compiler processes run, their wall and CPU seconds ($FUSION_C_COMPILE_LOG: a line
# each)
STATS = {"compiled": 0, "disk_hits": 0, "loaded": 0, "compiler_runs": 0, "compile_s": 0.0, "compile_cpu_s": 0.0}


class CompilerMissing(RuntimeError):
    """No C compiler here: the message names the fix."""


def check_renderer(name: object, where: str) -> str:
    return RENDERER.check(name, where)


def chosen() -> str:
    """The renderer CPU kernels use now: the backend's option, else $FUSION_RENDERER, else :data:`DEFAULT`."""
    name = RENDERER.explicit()
    if name is None:
        name = DEFAULT
        if not available()[0]:  # the default, without a compiler: said once
            if not _WARNED:
                _WARNED.append(True)
                warnings.warn(f"{available()[1]}. CPU kernels run in Triton's interpreter meanwhile", stacklevel=2)
            name = "triton"
    return name


_WARNED: list[bool] = []


def runs_as_c(region) -> bool:
    """Will the C renderer run this region's kernel: its tensors on the CPU, and C the renderer CPU kernels use now?"""
    devices = {n.meta["val"].device.type for n in region.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    return devices == {"cpu"} and chosen() == "c"


def use(renderer: str | None):
    """Kernels generated inside this block run on CPU tensors with ``renderer`` (None: leave the choice as it is)."""
    return RENDERER.use(renderer)


# ----------------------------------------------------------------------------------------------------------------------
# The compiler


def _find() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc.split()[0]) or cc.split()[0]
    return next((p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None)


def compiler() -> tuple[str, tuple[str, ...], str]:
    """(path, flags, version line) of the C compiler, probed once; :class:`CompilerMissing` without one."""
    found, why = _probe()
    if found is None:
        raise CompilerMissing(why)
    return found


@functools.cache
def _probe() -> tuple[tuple[str, tuple[str, ...], str] | None, str]:
    try:
        return _compiler(), ""
    except CompilerMissing as e:
        return None, str(e)


def forget_compiler() -> None:
    """Probe the compiler again at the next use (after CC or PATH changed)."""
    _probe.cache_clear()


def _compiler() -> tuple[str, tuple[str, ...], str]:
    cc = _find()
    if cc is None or not os.path.exists(cc):
        raise CompilerMissing(
            "no C compiler found (looked at $CC, cc, gcc, clang) for the C renderer of CPU kernels. Fix: install one "
            "(Debian/Ubuntu: apt install gcc; Fedora: dnf install gcc; macOS: xcode-select --install; Windows: "
            "LLVM's clang on PATH), or set CC=/path/to/compiler, or run CPU kernels in Triton's interpreter: "
            "FUSION_RENDERER=triton (or options={'renderer': 'triton'})"
        )
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError) as e:
        raise CompilerMissing(f"the C compiler {cc} does not run ({e}). Fix: set CC to a working compiler") from e
    # No fast-math: -fno-math-errno and -fno-trapping-math change no value (errno and FP exception flags are never
    # read; they let gcc vectorize loops with selects and floorf), fp-contract off keeps a*b+c two roundings.
    flags = ["-O3", "-shared", "-fPIC", "-fwrapv", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"]
    flags.append("-std=gnu11")
    with tempfile.TemporaryDirectory() as tmp:

        def works(extra: list[str], source: str = probes.PROBE, load: bool = False) -> bool:
            """Does ``source`` build with ``extra`` (and, if ``load``, does this process load the library)?"""
            out = _build_probe(cc, [*flags, *extra], source, tmp)
            if out is None:
                return False
            try:
                if load:
                    ctypes.CDLL(str(out))
            except OSError:  # built, but its libraries do not load here
                return False
            return True

        if not works([]):
            raise CompilerMissing(
                f"{cc} cannot build a shared library ({' '.join(flags)}). Fix: set CC to gcc or clang"
            )
        if works(["-march=native"]):
            flags.append("-march=native")
        # No red zone on x86-64. gcc 12.2 (-O3, -march=native with AVX-512) put a leaf kernel's OpenMP SIMD reduction
        # copies (a checked gather's out-of-range flag) in the red zone 8 bytes off the 16-byte alignment of the
        # aligned store it wrote them with: the kernel crashed (SIGSEGV in the masked sum of a relative-position bias
        # gradient, tests/test_scatter_passes.py; the same source crashes as a standalone program). Without the red
        # zone the frame is allocated, aligned; it costs one stack adjustment a call.
        x86_64 = platform.machine().lower() in ("x86_64", "amd64")
        if x86_64 and works(["-mno-red-zone"]):
            flags.append("-mno-red-zone")
        if works(["-fopenmp"]):
            flags.append("-fopenmp")
        elif works(["-fopenmp-simd"]):  # no OpenMP runtime (macOS without libomp): serial, SIMD pragmas still read
            flags.append("-fopenmp-simd")
        if sys.platform.startswith("linux") and x86_64:
            from fusion.kernels.c_prelude import VECTOR_LIBM_DECLARATIONS

            if works(
                probes.VECTOR_LIBM, "#include <math.h>\n" + VECTOR_LIBM_DECLARATIONS + probes.VECTOR_PROBE, load=True
            ):
                flags += probes.VECTOR_LIBM
        for source, check, flag, what in probes.MISCOMPILES:  # each checked by running it, each avoided by one flag
            if not probe_kept(cc, flags, tmp, source, check):
                flags.append(flag)
                if not probe_kept(cc, flags, tmp, source, check):
                    raise CompilerMissing(
                        f"{cc} ({' '.join(flags)}) {what} (a wrong answer). Fix: set CC to another compiler, or run "
                        "CPU kernels in Triton's interpreter: FUSION_RENDERER=triton"
                    )
    return cc, tuple(flags), version


def _build_probe(cc: str, flags: list[str], source: str, tmp: str) -> Path | None:
    """``source`` built with ``cc`` and ``flags`` into a shared library in ``tmp`` under a name of its own (a library
    this process loaded is never rebuilt under its name): the library's path, or None where it does not build."""
    src, out = Path(tmp) / "probe.c", Path(tmp) / f"probe{len(list(Path(tmp).glob('probe*.so')))}.so"
    src.write_text(source)
    cmd = [cc, *flags, str(src), "-o", str(out), *libraries(flags)]
    return out if subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0 else None


def probe_kept(cc: str, flags: list[str], tmp: str, source: str, check) -> bool:
    """Does ``source`` (a ``c_probes`` miscompile probe) built by ``cc`` with ``flags`` in ``tmp`` pass
    ``check(library)``? True where the probe does not build or load: no sign of the miscompile (the first kernel's
    build says what is wrong)."""
    try:
        out = _build_probe(cc, flags, source, tmp)
        lib = ctypes.CDLL(str(out)) if out is not None else None
    except (OSError, subprocess.SubprocessError):
        return True
    return lib is None or check(lib)


def libraries(flags: tuple[str, ...] | list[str]) -> list[str]:
    """What a kernel library links, after its source (libmvec where the prelude declares its functions)."""
    return (["-lmvec"] if probes.VECTOR_LIBM[0] in flags else []) + ["-lm"]


def cores() -> int:
    """The CPU cores this process may use (its affinity where the OS says, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available() -> tuple[bool, str]:
    """(is there a compiler, what it is / the message naming the fix). Never raises."""
    try:
        cc, flags, version = compiler()
    except CompilerMissing as e:
        return False, str(e)
    return True, f"{version} ({cc} {' '.join(flags)})"


def openmp() -> bool:
    return "-fopenmp" in compiler()[1]


def _cache() -> Path:
    """``<cache>/c``: the kernels' cache directory ($FUSION_CACHE_DIR, else <tmp>/fusion_kernels_<user>, as
    ``triton_runtime.cache_dir``), the C libraries in their own folder."""
    root = os.environ.get("FUSION_CACHE_DIR")
    if not root:
        user = os.environ.get("USER") or os.environ.get("USERNAME") or str(os.getuid() if hasattr(os, "getuid") else 0)
        root = os.path.join(tempfile.gettempdir(), f"fusion_kernels_{user}")
    path = Path(root) / "c"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` across processes (fcntl); without fcntl (Windows) the rename still keeps a
    library whole, two processes may only both compile it."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def try_lock(path: Path, held: contextlib.ExitStack) -> bool:
    """Take the lock on ``path`` if no one holds it (kept until ``held`` closes): True; False where another process
    (or open file of this one) holds it. Without fcntl, True: the rename still keeps a library whole."""
    try:
        import fcntl
    except ImportError:
        return True
    f = held.enter_context(open(path, "a+"))
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    held.callback(fcntl.flock, f, fcntl.LOCK_UN)
    return True


_LIBS: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()
_STATS_LOCK = threading.Lock()


def library_path(source: str, name: str) -> Path:
    cc, flags, version = compiler()
    key = (source, " ".join(flags), version, sys.platform, _cpu())  # -march=native: a library per CPU model
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:20]
    return _cache() / f"{name}_{digest}.so"


def load(source: str, name: str) -> ctypes._CFuncPtr:
    """The function ``name`` of ``source`` compiled (or found in the disk cache) and loaded."""
    path = library_path(source, name)
    with _LOCK:
        lib = _LIBS.get(str(path))
        if lib is None:
            built = build_once(path, source, lambda c_file, out: run_compiler(c_file, out, name))
            STATS["compiled" if built else "disk_hits"] += 1
            lib = open_library(path)
    return function(lib, name)


def build_once(path: Path, source: str, build: Callable[[Path, Path], object]) -> bool:
    """Make the library ``path`` from ``source`` unless it is on disk: under its lock across processes, the source as
    ``.c``, ``build(c_file, out)`` into a file of this thread, one rename (no reader sees half a library). True: built."""
    if path.exists():
        return False
    with _locked(path.with_suffix(".lock")):
        if path.exists():
            return False
        c_file = path.with_suffix(".c")
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        c_file.write_text(source)
        build(c_file, tmp)
        os.replace(tmp, path)
        return True


def open_library(path: Path) -> ctypes.CDLL:
    """The library at ``path``, loaded once per process (``_LIBS``; callers hold ``_LOCK``)."""
    lib = _LIBS.get(str(path))
    if lib is None:
        lib = _LIBS[str(path)] = ctypes.CDLL(str(path))
        STATS["loaded"] += 1
    return lib


def function(lib: ctypes.CDLL, name: str) -> ctypes._CFuncPtr:
    fn = getattr(lib, name)
    fn.restype = None
    return fn


def run_compiler(c_file: Path, out: Path, what: str) -> float:
    """Compile ``c_file`` into the shared library ``out`` (seconds taken); RuntimeError with the compiler's message.
    Counted in ``STATS`` (wall seconds, and the CPU seconds of the compiler and its passes where ``os.wait4`` reports
    them); with ``$FUSION_C_COMPILE_LOG`` set, a line ``pid wall_s cpu_s what test`` appended to that file (the
    test: pytest's current one, else -)."""
    cc, flags, _ = compiler()
    start = time.perf_counter()
    code, stderr, cpu = _run([cc, *flags, str(c_file), "-o", str(out), *libraries(flags)], timeout=300)
    seconds = time.perf_counter() - start
    with _STATS_LOCK:  # bundles compile in threads (fusion.kernels.c_bundle)
        STATS["compiler_runs"] += 1
        STATS["compile_s"] += seconds
        STATS["compile_cpu_s"] += cpu
    if log := os.environ.get("FUSION_C_COMPILE_LOG"):
        with open(log, "a") as f:
            f.write(
                f"{os.getpid()} {seconds:.3f} {cpu:.3f} {what} {os.environ.get('PYTEST_CURRENT_TEST', '-').split()[0]}\n"
            )
    if code != 0:
        raise RuntimeError(f"{cc} failed on {c_file} ({what}):\n{stderr[-4000:]}")
    return seconds


def _run(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    """(exit code, stderr, CPU seconds of the process and the children it waited for: 0.0 without ``os.wait4``)."""
    if not hasattr(os, "wait4"):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stderr, 0.0
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        err.seek(0)
        return code, err.read().decode(errors="replace"), usage.ru_utime + usage.ru_stime


@functools.cache
def _cpu() -> str:
    """The CPU's model and feature flags (Linux), else what platform says."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        return "\n".join(sorted({ln for ln in info.splitlines() if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


class CKernel:
    """A compiled C kernel: ``kernel(*inputs, *outputs)`` on CPU tensors (pointers to their first elements), the
    threads torch uses (``torch.get_num_threads()``). Measured on EfficientNet-B0's smallest kernel (one thread):
    1.45 us a call, of which the ctypes call itself 1.05 us (argtypes set once); a launch through its ``Launcher``
    ~3.0 us (the output's allocation 1.4 us). ``map(Tensor.data_ptr, ...)`` instead of the list saved nothing."""

    def __init__(self, fn, name: str, source: str, nargs: int) -> None:
        self.fn, self.name, self.source = fn, name, source
        fn.argtypes = [ctypes.c_void_p] * nargs + [ctypes.c_int]
        fn.restype = ctypes.c_int if RANGE_FLAG in source else None  # indexed reads: 1 if an index was out of range

    def __call__(self, *tensors: torch.Tensor) -> None:
        if self.fn(*[t.data_ptr() for t in tensors], torch.get_num_threads()):
            raise IndexError(index_error(self.name))


def index_error(kernel: str) -> str:
    """What a kernel that read an index outside its dimension raises (eager raises IndexError on the same input)."""
    return (
        f"index out of range in the generated kernel {kernel}: an index it reads (an embedding's id, an index or "
        "gather position) lies outside the dimension it indexes, as eager would report with IndexError. "
        "Fix: pass indices within the indexed tensor's size (embedding ids below num_embeddings)"
    )


def named(kernel) -> tuple[str, str, str]:
    """(its code's name, its C source, the source with the kernel named by its code) of a kernel IR record."""
    from fusion.kernels.c_render import render

    source = render(kernel)
    # Compiled and cached under a name of its code: a kernel's own name counts kernels per process (..._<n>), so the
    # same code gets another name in a run with other tests or regions before it (a miss of the disk cache).
    code = "k_" + hashlib.sha256(source.replace(kernel.name, "").encode()).hexdigest()[:20]
    return code, source, source.replace(kernel.name, code)


def compile_kernel(kernel) -> CKernel:
    """A kernel IR record rendered to C, compiled (or found in the disk cache) and loaded: ``k(*buffers)``. A graph's
    kernels compile together first (``fusion.kernels.c_bundle``); this compiles one alone."""
    code, source, renamed = named(kernel)
    try:
        fn = load(renamed, code)
    except CompilerMissing:
        raise
    except RuntimeError as e:  # the compiler's message, naming the kernel as the graph knows it
        raise RuntimeError(f"kernel {kernel.name}: {e}") from e
    return CKernel(fn, kernel.name, source, len(kernel.buffers))


def kernel_for(plan) -> tuple[CKernel | None, str]:
    """(the C kernel of a Phase 8 ``KernelPlan``, "") or (None, why not: a region the IR does not take, no
    compiler). A compile error is a renderer bug: raised in tests, a reason otherwise."""
    from fusion.common import fallback_reason

    kernel = plan.ir
    if kernel is None:
        return None, "the plan holds no kernel IR"
    try:
        return compile_kernel(kernel), ""
    except CompilerMissing as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a renderer bug: raised in tests, Triton's interpreter otherwise
        return None, "C renderer failed: " + fallback_reason(e, "the C renderer")


def refusal(plan, triton: bool = False):
    """Why the C renderer cannot run ``plan`` (an ``Unsupported``), or None: without Triton (``triton`` False), a
    kernel not on the CPU. A kernel on another device is Triton's where Triton runs."""
    from fusion.ir.plan import Unsupported

    if any(n.meta["val"].device.type != "cpu" for n in (*plan.inputs, *plan.stored)):
        return None if triton else Unsupported("Triton is not installed and the kernel is not on the CPU (C's device)")
    return None
