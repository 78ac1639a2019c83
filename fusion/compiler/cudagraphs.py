"""``options={"cudagraphs": True}``: one compiled aten graph replayed as one CUDA graph (off by default).

A CUDA graph records every kernel a call launches, with its arguments, once; a replay launches them all with one
CPU call. What a call costs on the CPU (Python, our launchers, cuBLAS/cuDNN dispatch) is then paid once, at the
recording. What it costs in correctness is that a replay reads and writes the *addresses* it recorded:

* **inputs** that are not parameters (the model's inputs, e.g. token ids) are copied into buffers the graph owns,
  every call (their address and their contents may change);
* **parameters and buffers** (AOTAutograd's ``static_input_indices``, as Inductor's ``get_static_input_idxs``) and
  the **folded BatchNorm weights** are read in place: an in-place update (``p.mul_(2)``, an optimizer step) is
  seen by the next replay; one at a new address (``p.data = t``, ``load_state_dict`` with ``assign=True``, a
  refold after a statistic changed) makes the next call record again;
* a graph that **mutates an input** (AOTAutograd keeps such an inference mutation as a ``copy_`` into the
  placeholder) writes our buffer, which is copied back into the caller's tensor after the replay;
* **outputs** live in memory the next replay overwrites: each call hands out clones (one device copy per output),
  never the graph's own buffers (Inductor's cudagraph trees hand them out and invalidate them on the next replay:
  faster, with an error on a stale read; cloning is the simple rule that can never give a stale answer).

Only inference graphs are recorded (a training step's forward saves tensors for a backward that runs later: that
needs Inductor's tree of graphs sharing one memory pool); training graphs run as they are, with a report note. A
graph whose recording fails (a CPU sync such as ``.item()``, a CPU tensor input) runs as it is, with the reason.
Each recorded graph has its own memory pool: simple and safe, more memory than Inductor's shared pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.fx as fx

aten = torch.ops.aten


def static_input_indices(gm: fx.GraphModule) -> set[int]:
    """Graph inputs read in place (parameters and buffers; folded weights): from AOTAutograd's metadata during the
    compile, plus the placeholders a pass added (``meta["folded"]``). Without metadata: none (all copied)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    static = {i for i, n in enumerate(placeholders) if n.meta.get("folded")}
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    static.update(getattr(meta, "static_input_indices", None) or ())
    return static


def mutated_input_indices(gm: fx.GraphModule) -> list[int]:
    """Inputs the graph writes: a placeholder passed as an argument its op's schema marks written (``Tensor(a!)``):
    a ``copy_`` into it, an ``add_``, the running statistics of an in-place BatchNorm (pass ``reinplace``)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    index = {n: i for i, n in enumerate(placeholders)}
    out = []
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
            continue
        for arg, value in zip(target._schema.arguments, node.args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write and value in index:
                out.append(index[value])
    return sorted(set(out))


def refusal(gm: fx.GraphModule, kind: str) -> str:
    """Why this graph is not recorded ("" when it is)."""
    if kind != "inference":
        return f"a {kind} graph: only inference graphs are recorded (a training step runs as it is)"
    if not torch.cuda.is_available():
        return "no CUDA here: the option does nothing on a CPU"
    vals = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    devices = {v.device.type for v in vals if isinstance(v, torch.Tensor)}
    if devices != {"cuda"}:
        return f"inputs on {sorted(devices) or 'no device'}: a CUDA graph reads CUDA memory only"
    if any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape))
           for v in vals):  # fmt: skip
        return "dynamic shapes: a recording is of fixed sizes"
    aliased = _outputs_aliasing_inputs(gm)
    if aliased:  # AOTAutograd rebuilds such an output from the caller's input and our output's view metadata
        return f"output(s) {', '.join(aliased)} alias a graph input: a copied-in buffer would be a wrong base"
    return ""


def _outputs_aliasing_inputs(gm: fx.GraphModule) -> list[str]:
    from fusion.aten.nodes import is_view_node

    (output,) = gm.graph.find_nodes(op="output")
    outputs, aliased = [], []
    fx.node.map_arg(output.args, outputs.append)
    for node in outputs:
        base = node
        while isinstance(base, fx.Node) and base.op == "call_function" and is_view_node(base) and base.args:
            base = base.args[0]
        if isinstance(base, fx.Node) and base.op == "placeholder":
            aliased.append(node.name)
    return aliased


class CudaGraphRunner:
    """``runner(*args)``: ``run(*args)`` replayed from a CUDA graph (recorded on the first call, again when a static
    input moves). ``recordings``: how many times it recorded; ``error``: why it stopped recording ("" if it did not).
    """

    def __init__(self, run: Callable, static: set[int], mutated: Sequence[int], cuda=torch.cuda) -> None:
        self.cuda = cuda  # torch.cuda; the CPU tests pass a stand-in that replays by running again
        self.run = run
        self.static = set(static)
        self.mutated = list(mutated)
        self.graph = None  # a torch.cuda.CUDAGraph once recorded
        self.recordings = 0
        self.replays = 0
        self.error = ""

    def _record(self, args: Sequence[object]) -> None:
        cuda = self.cuda
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.device.type != getattr(cuda, "device_type", "cuda") for t in tensors):
            raise RuntimeError("a CPU tensor input: a CUDA graph reads CUDA memory only")
        # Our own buffers for what is copied in; static inputs are recorded at their own address.
        self.inputs = [a if (i in self.static or not isinstance(a, torch.Tensor)) else _buffer_like(a)
                       for i, a in enumerate(args)]  # fmt: skip
        self.pointers = {i: args[i].data_ptr() for i in self.static if isinstance(args[i], torch.Tensor)}
        self._recorded = list(self.pointers.values())
        self._copy_in(args)  # the warm-up runs on the real values (token ids index tables: never garbage)
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):  # warm-up: compiles kernels, initialises cuBLAS workspaces
            self.run(*self.inputs)
        cuda.current_stream().wait_stream(side)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            outputs = self.run(*self.inputs)
        self.graph, self.outputs = graph, outputs
        self.recordings += 1

    def __call__(self, *args: object):
        if self.error:
            return self.run(*args)
        graph = self.graph
        if graph is None or [args[i].data_ptr() for i in self.pointers] != self._recorded:  # ~0.1 µs per input
            try:
                self.graph = None
                self._record(args)
            except Exception as e:  # noqa: BLE001 - never a crash: run as it is, with the reason
                self.error = f"recording failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
                self.graph = None
                return self.run(*args)
        self._copy_in(args)
        self.graph.replay()
        self.replays += 1
        for i in self.mutated:
            if self.inputs[i] is not args[i]:
                args[i].copy_(self.inputs[i])
        return _clone(self.outputs)

    def _copy_in(self, args: Sequence[object]) -> None:
        for i, a in enumerate(args):
            buf = self.inputs[i]
            if buf is not a and i not in self.static and isinstance(a, torch.Tensor):
                buf.copy_(a)


def _buffer_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def _clone(out):
    if isinstance(out, torch.Tensor):
        return out.clone(memory_format=torch.preserve_format)
    if isinstance(out, (list, tuple)):
        return type(out)(_clone(o) for o in out)
    return out


def maybe_wrap(run: Callable, gm: fx.GraphModule, kind: str, note: Callable[..., None]) -> Callable:
    """``run`` replayed from a CUDA graph where :func:`refusal` allows it; ``note(pass, nodes, action, why)``."""
    why = refusal(gm, kind)
    if why:
        note("cudagraphs", ["the whole graph"], "skipped", why)
        return run
    static, mutated = static_input_indices(gm), mutated_input_indices(gm)
    if static & set(mutated):  # the warm-up and the replay would both write it: twice the update
        note("cudagraphs", ["the whole graph"], "skipped", "the graph writes a parameter or buffer in place")
        return run
    runner = CudaGraphRunner(run, static, mutated)
    note("cudagraphs", ["the whole graph"], "recorded on the first call",
         f"{len(runner.static)} inputs read in place, the others copied in; outputs cloned")  # fmt: skip
    return runner
