"""An unsolved exercise and a failing compiler stage: a ``TODO(human)`` stub raises ``NotImplementedError`` whose
message starts with "TODO(human)" (:func:`is_todo`, found at :func:`todo_site`); a compiler stage's ``except`` asks
:func:`fallback_reason` whether to fall back to aten or raise (:func:`strict_compiler`: under pytest and in a practice
workspace a bug in a solution must be seen)."""

from __future__ import annotations

import linecache
import os
import traceback


def is_todo(exc: BaseException) -> bool:
    return isinstance(exc, NotImplementedError) and str(exc).startswith("TODO(human)")


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout holding fusion/


def todo_site(exc: BaseException) -> tuple[str, int] | None:
    """Where an unsolved TODO(human) stopped the run: (path, line) of its ``# TODO(human):`` comment (of the stub
    itself when the comment is gone), the path relative to the project root. ``practice check`` names the same
    place as "Next", so the lesson and the checker point at one TODO."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return None
    frame, line = frames[-1]  # the stub's `raise` is the innermost frame
    path = frame.f_code.co_filename
    if linecache.getline(path, line - 1).strip().startswith("# TODO(human):"):
        line -= 1
    rel = os.path.relpath(path, _ROOT)
    return (path if rel.startswith("..") else rel.replace(os.sep, "/")), line


class CompilerStageError(RuntimeError):
    """An exception inside a compiler stage (often a learner's solution), shown instead of a silent fallback."""


def strict_compiler() -> bool:
    """Should a compiler stage raise an unexpected exception rather than run the graph uncompiled?

    ``FUSION_STRICT=1`` forces it and ``FUSION_STRICT=0`` turns it off; unset, it is on under pytest and in a
    practice workspace (``.practice.json`` beside ``fusion/``), where a bug in a solution must be seen, and off
    for everyone else, whose compile never crashes: the aten graph is always a correct answer.
    """
    flag = os.environ.get("FUSION_STRICT")
    if flag in ("0", "1"):
        return flag == "1"
    return "PYTEST_CURRENT_TEST" in os.environ or os.path.isfile(os.path.join(_ROOT, ".practice.json"))


def _lesson_frame(exc: BaseException) -> str:
    """'fusion/backend.py:97 in find_conv_bn_folds': the innermost frame in a lesson file (fusion/<phase>.py)."""
    lessons = os.path.join(_ROOT, "fusion")
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        path = frame.f_code.co_filename
        if os.path.dirname(os.path.abspath(path)) == lessons:
            return f"fusion/{os.path.basename(path)}:{line} in {frame.f_code.co_name}"
    return ""


def _is_dynamo_restart(exc: BaseException) -> bool:
    """Dynamo's own control flow (RestartAnalysis and its kin, e.g. TensorifyScalarRestartAnalysis): it traces again."""
    return any(cls.__name__.endswith("RestartAnalysis") for cls in type(exc).__mro__)


def fallback_reason(exc: BaseException, stage: str, expected: tuple[type[BaseException], ...] = ()) -> str:
    """The one rule for a compiler stage's ``except``: the reason to report when the stage falls back to aten, or
    a raise. An unsolved TODO(human) is raised as it is; in :func:`strict_compiler` mode any exception other than
    ``expected`` (e.g. ``Unsupported``: a reason, not a bug) is raised as :class:`CompilerStageError`, naming the
    lesson function it came from."""
    if is_todo(exc) or _is_dynamo_restart(exc):  # a TODO, or Dynamo asking to trace again: never a fallback
        raise exc
    text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if strict_compiler() and not isinstance(exc, expected):
        where = _lesson_frame(exc)
        at = f" (raised at {where}: check your solution of the TODO there)" if where else ""
        raise CompilerStageError(
            f"{stage} failed: {text}{at}. Outside tests and practice workspaces the graph would run uncompiled; "
            "FUSION_STRICT=0 does that here too"
        ) from exc
    return text


def todo_message(exc: BaseException) -> str:
    """The unsolved TODO's message and, on the next line, where it is."""
    site = todo_site(exc)
    return f"{exc}" + (f"\n  at {site[0]}:{site[1]}" if site else "")
