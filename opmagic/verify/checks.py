"""``check_op``: torch.library.opcheck, and gradcheck for ops with a backward, as a table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._torch import custom_op_state
from ..cells.history import CheckSample
from ..cells.session import active_session
from ..dispatch.ops import op_ref
from ..dispatch.resolve.binding import select_overload
from ..dispatch.torch_functions import unbind
from ..display import Displayable
from ..errors import ArgumentTypeError, is_list_of_values
from .values import describe_arguments, first_line


@dataclass(frozen=True)
class CheckRow:
    """The outcome of one check."""

    name: str
    status: str  # "pass", "FAIL" or "skip"
    detail: str  # the first line of the error, or why the check was skipped


@dataclass(frozen=True)
class CheckReport(Displayable):
    """Every check run on one operator with one set of sample arguments."""

    op: str
    inputs: str  # the sample arguments, described
    rows: tuple[CheckRow, ...]

    @property
    def passed(self) -> bool:
        """No check failed."""
        return all(row.status != "FAIL" for row in self.rows)

    @property
    def summary(self) -> str:
        """``"5 passed"`` or ``"2 of 5 failed"``."""
        failed = sum(row.status == "FAIL" for row in self.rows)
        ran = sum(row.status != "skip" for row in self.rows)
        return f"{failed} of {ran} failed" if failed else f"{ran} passed"


def check_op(op: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> CheckReport:
    """Run ``torch.library.opcheck`` on ``op(*args, **kwargs)``; for an op made with
    ``custom_op`` that has a backward, also ``torch.autograd.gradcheck`` in float64.

    ``op``: what :func:`opmagic.resolve` takes: ``"ns::name"`` or ``"ns::name.overload"``, a
    ``torch.ops`` object or a custom op (a packet's overload is chosen from the arguments).
    Failures are rows of the report, not exceptions; an ``op`` or arguments that cannot be
    checked raise an :class:`~opmagic.errors.OpmagicError` naming them.
    """
    if not is_list_of_values(args):
        raise ArgumentTypeError(
            f"check_op: args must be the sample arguments as a tuple or list, got {args!r}; "
            "write (x,) for one argument."
        )
    if kwargs is not None and (
        not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs)
    ):
        raise ArgumentTypeError(
            f"check_op: kwargs must be a dict of keyword arguments by name, got {kwargs!r}."
        )
    op, args = unbind(op, tuple(args))  # x.add: x is the first argument
    kwargs = dict(kwargs or {})
    target, opdef, name = checked_operator(op, args, kwargs)
    outcomes = torch.library.opcheck(target, args, kwargs, raise_exception=False)
    rows = [_opcheck_row(check, outcome) for check, outcome in outcomes.items()]
    if opdef is not None and custom_op_state.custom_op_parts(opdef)["backward"] is not None:
        rows.append(gradcheck_row(target, args, kwargs))
        session = active_session()
        if session is not None and rows[-1].status == "pass":  # the export tests it again
            session.record_check("gradcheck", target, [CheckSample(args, kwargs)])
    return CheckReport(name, describe_arguments(args, kwargs), tuple(rows))


def checked_operator(op: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any, str]:
    """``(what to call, its CustomOpDef or None, its name)`` for an operator as
    :func:`opmagic.resolve` takes it, a packet's overload chosen from the arguments."""
    if custom_op_state.is_custom_op_def(op):
        return op, op, op._qualname
    ref = op_ref(op)
    if ref.overload is None:
        ref = ref.with_overload(select_overload(ref, args, kwargs))
    opdef = custom_op_state.custom_op_def(ref.qualname) if ref.overload == "" else None
    return ref.op_overload(), opdef, ref.dispatcher_name


def _opcheck_row(name: str, outcome: Any) -> CheckRow:
    """A row from one of opcheck's outcomes: ``"SUCCESS"``, a skip reason or an exception."""
    if outcome == "SUCCESS":
        return CheckRow(name, "pass", "")
    if isinstance(outcome, str):
        return CheckRow(name, "skip", outcome)
    return CheckRow(name, "FAIL", first_line(outcome))


def gradcheck_row(op: Any, args: tuple, kwargs: dict[str, Any]) -> CheckRow:
    """gradcheck with every floating-point tensor argument as a float64 leaf needing grad (the
    export's gradcheck test does the same)."""
    inputs = [_as_grad_input(value) for value in args]
    if not any(isinstance(v, torch.Tensor) and v.requires_grad for v in inputs):
        return CheckRow("gradcheck", "skip", "no floating-point tensor argument")
    try:
        torch.autograd.gradcheck(lambda *xs: op(*xs, **kwargs), tuple(inputs))
    except Exception as error:
        return CheckRow("gradcheck", "FAIL", first_line(error))
    return CheckRow("gradcheck", "pass", "")


def _as_grad_input(value: Any) -> Any:
    """A floating-point tensor as a float64 leaf that needs grad; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64).requires_grad_(True)
    return value
