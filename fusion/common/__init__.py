"""Shared plumbing for every phase: tracing with a clear error, node tables, fusion reports, lesson runners.

Nothing in here is an exercise: the learner regions live in the phase modules. Every pass in the package
uses these helpers so that errors, reports and printed tables look the same from phase to phase. One module a
concern, every public name importable from here (``from fusion.common import table``):

* :mod:`~fusion.common.tracing` — tracing with one clear error (:func:`trace_module`, :func:`copy_to_graph_module`);
* :mod:`~fusion.common.text` — node tables, tables, headings, the numbers a lesson prints;
* :mod:`~fusion.common.reports` — what a pass fused and skipped, and why (:class:`FusionReport`);
* :mod:`~fusion.common.rewrite` — the clean-up every rewrite ends with (:func:`finish_rewrite`);
* :mod:`~fusion.common.todo` — an unsolved TODO(human), and a compiler stage's fallback or raise;
* :mod:`~fusion.common.cli` — the command line every lesson shares (:func:`lesson_cli`).

    >>> import torch
    >>> from fusion.common import trace_module, node_table
    >>> gm = trace_module(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    >>> [n.op for n in gm.graph.nodes]
    ['placeholder', 'call_module', 'call_module', 'output']
"""

from fusion.common.cli import cli_prog, lesson_cli, lesson_name, plain, run_lesson
from fusion.common.reports import REPORT_KEY, FusionDecision, FusionReport, attach_report, report_of, show_rewrite
from fusion.common.rewrite import finish_rewrite, has_effect, mutates_an_input
from fusion.common.text import aten_ops, heading, max_abs_diff, node_table, shorten, table, target_name
from fusion.common.todo import (
    CompilerStageError,
    fallback_reason,
    is_todo,
    strict_compiler,
    todo_message,
    todo_site,
)
from fusion.common.tracing import UntraceableModelError, copy_to_graph_module, ensure_module, trace_module

__all__ = [
    "REPORT_KEY",
    "CompilerStageError",
    "FusionDecision",
    "FusionReport",
    "UntraceableModelError",
    "aten_ops",
    "attach_report",
    "cli_prog",
    "copy_to_graph_module",
    "ensure_module",
    "fallback_reason",
    "finish_rewrite",
    "has_effect",
    "heading",
    "is_todo",
    "lesson_cli",
    "lesson_name",
    "max_abs_diff",
    "mutates_an_input",
    "node_table",
    "plain",
    "report_of",
    "run_lesson",
    "shorten",
    "show_rewrite",
    "strict_compiler",
    "table",
    "target_name",
    "todo_message",
    "todo_site",
    "trace_module",
]
