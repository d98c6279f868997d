"""torch.compile's own records, read by the trace: whether dynamo is compiling on this thread,
and what it recorded of each frame it compiled (its compilation metrics).

Read only, never configured: nothing here changes what torch.compile does. Dynamo is not
imported for this; without it nothing was compiled and there is nothing to read.
"""

from __future__ import annotations

import re
import sys
from typing import Any, NamedTuple

_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_(?P<line>\d+)$")


def eval_frame_setter() -> Any:
    """Dynamo's ``set_eval_frame(callback) -> prior``: the hook through which torch.compile
    sees every Python frame a compiled function's run starts (``None`` switches it off)."""
    from torch._C._dynamo import eval_frame  # part of torch's extension: no dynamo import

    return eval_frame.set_eval_frame


def compiling() -> str | None:
    """The compile id (``0/0``) dynamo is compiling on this thread right now, or ``None``."""
    from torch._guards import CompileContext  # imported with torch

    compile_id = CompileContext.current_compile_id()
    return None if compile_id is None else str(compile_id)


class CompiledFrame(NamedTuple):
    """What dynamo recorded of one frame it compiled."""

    compile_id: str  # ``0/0``: frame 0, its first compilation
    name: str  # the function's name (``f``), for a resume function the one it resumes
    filename: str
    line: int  # the function's first line
    resumes_at: int | None  # a resume function: the line of the graph break it resumes after
    custom_ops: frozenset[str]  # the non-aten operators its graph calls (``mylib::clip``)
    graph_breaks: int  # graph breaks dynamo found in the function (its resume functions)


def compiled_frames() -> dict[str, CompiledFrame]:
    """Each frame dynamo compiled in this process (as far as its bounded record of
    compilation metrics goes), by compile id; empty when dynamo was never imported."""
    if "torch._dynamo.utils" not in sys.modules:
        return {}
    from torch._dynamo.utils import get_compilation_metrics

    metrics = [m for m in get_compilation_metrics() if m.compile_id and m.co_name]
    origins = {m.compile_id: _resumed(m.co_name) for m in metrics}
    resumes: dict[tuple[str, str], set[str]] = {}
    for m in metrics:
        name, line = origins[m.compile_id]
        if line is not None:
            resumes.setdefault((name, m.co_filename or ""), set()).add(m.co_name)
    frames = {}
    for m in metrics:
        name, line = origins[m.compile_id]
        ops = set(m.compliant_custom_ops or ()) | set(m.non_compliant_ops or ())
        frames[m.compile_id] = CompiledFrame(
            m.compile_id,
            name,
            m.co_filename or "",
            m.co_firstlineno or 0,
            line,
            frozenset(str(op) for op in ops if not str(op).startswith(("aten::", "prims::"))),
            len(resumes.get((name, m.co_filename or ""), ())),
        )
    return frames


def _resumed(co_name: str) -> tuple[str, int | None]:
    """``(the function's name, the graph break's line)`` of a resume function's name
    (``torch_dynamo_resume_in_f_at_9``); ``(co_name, None)`` for another function."""
    match = _RESUME.match(co_name)
    if match is None:
        return co_name, None
    inner, _ = _resumed(match["name"])  # a resume of a resume names the first function
    return inner, int(match["line"])
