"""Tracing with one clear error instead of a deep torch traceback: :func:`trace_module`, :func:`copy_to_graph_module`
(a traced deep copy: passes never touch the caller's model) and :func:`ensure_module`."""

from __future__ import annotations

import copy
import os
import traceback

import torch
import torch.fx as fx


class UntraceableModelError(RuntimeError):
    """``torch.fx.symbolic_trace`` could not turn the model into a graph. The message says why and how to fix it."""


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # with the separator: torchvision/, torchaudio/ are not torch/
_HERE = os.path.dirname(os.path.abspath(__file__))


def _user_frame(exc: BaseException) -> str:
    """The last traceback line outside torch itself: the line of the user's forward() that broke tracing."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_TORCH_DIR)]
    frames = [f for f in frames if os.path.dirname(os.path.abspath(f.filename)) != _HERE]  # nor fusion/common/
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {os.path.basename(f.filename)}:{f.lineno} `{(f.line or '').strip()}`)"


def _plain_reason(exc: BaseException) -> str:
    """Why symbolic tracing failed, in words that name the Python construct and the fix."""
    msg = str(exc)
    proxy = "Symbolic tracing runs forward() once with Proxy objects instead of tensors; a Proxy records operations "
    if "interpreted as an integer" in msg or ("Proxy" in msg and ("int()" in msg or "float()" in msg)):
        return (
            "its forward() uses a tensor's size or value as a Python number, e.g. `for i in range(x.shape[0])` or "
            f"`int(x.size(0))`. {proxy}and x.shape[0] is one too: range() and int() need a real int. Fix: loop over "
            "a count the model knows when it is built (a constructor argument), pass the size as a plain forward() "
            "argument fixed with symbolic_trace(model, concrete_args={'n': 4}), or move the loop into a function "
            "decorated with @torch.fx.wrap (recorded as one call, not traced into)"
        )
    if "iterated" in msg or "iteration" in msg or "__iter__" in msg or "__len__" in msg:
        return (
            "its forward() iterates over a traced value (`for row in x`, `a, b = x`, `*x`, len(x)); every forward() "
            f"argument is one, an optional list too. {proxy}but has no length to loop over. Fix: index a fixed "
            "number of times (x[0], x[1]), move the loop into a function decorated with @torch.fx.wrap, or fix an "
            "argument that is not a tensor with concrete_args, e.g. symbolic_trace(model, concrete_args={'targets': "
            "None})"
        )
    if "control flow" in msg or "__bool__" in msg:
        return (
            f"its forward() branches or loops on the *value* of a tensor. {proxy}but holds no values, so Python "
            "cannot decide `if`/`while` on it. Fix: make the branch independent of data (e.g. torch.where), move it "
            "into a leaf function with torch.fx.wrap, or pass concrete_args for the input it depends on"
        )
    return (
        f"{type(exc).__name__}: {msg}. Tracing stopped at the line named above, with a Proxy where that call needs a "
        "real value. Fix: move that call into a function decorated with @torch.fx.wrap (recorded as one node, not "
        "traced into), or pass the argument it depends on as concrete_args"
    )


def ensure_module(model: object, what: str = "this pass") -> torch.nn.Module:
    """Refuse a non-Module with one clear TypeError; a Module *class* gets the call to make instead."""
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        name = model.__name__
        raise TypeError(
            f"{what} needs a torch.nn.Module instance, got the class {name}; pass an instance: {name}() "
            f"(e.g. {what}({name}(...)) with its constructor arguments)"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"{what} needs a torch.nn.Module (or a torch.fx.GraphModule), got {type(model).__name__}. "
            "Fix: pass the model object itself, e.g. fuse(MyNet()) rather than fuse(output)"
        )
    return model


def trace_module(model: torch.nn.Module, *, what: str = "symbolic_trace") -> fx.GraphModule:
    """``torch.fx.symbolic_trace(model)``, with one clear error naming the model and the fix when it fails.

    The model is traced as it is (not copied): the GraphModule shares its submodules and parameters.
    Passes that rewrite use :func:`copy_to_graph_module` instead, which never touches the caller's model.
    """
    ensure_module(model, what)
    try:
        return fx.symbolic_trace(model)
    except Exception as e:  # TraceError, TypeError from Proxy.__bool__/__iter__, ...
        raise UntraceableModelError(f"cannot trace {type(model).__name__}{_user_frame(e)}: {_plain_reason(e)}") from e


def copy_to_graph_module(model: torch.nn.Module, *, what: str = "this pass") -> fx.GraphModule:
    """A traced *deep copy* of ``model``: rewrite it freely, the caller's parameters, modules and graph stay as they are."""
    ensure_module(model, what)
    return trace_module(copy.deepcopy(model), what=what)
