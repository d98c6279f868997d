"""Sample arguments for an operator, built from its schema: what the explorer's inputs make,
and the doctor's samples when it is given none.

Every tensor argument gets a :class:`TensorSpec` (device, dtype, requires_grad, layout,
conj/neg view, shape); other arguments the schema requires get a Python expression to
edit. Arguments with defaults are left to their defaults. Types no sample can be made
for (a Storage, a required Generator, TorchBind objects) raise :class:`SampleError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dispatch.ops import OpParameter
from ..errors import OpmagicError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "complex64": torch.complex64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
LAYOUTS = ("strided", "sparse")
VIEWS = ("none", "conj", "neg")
LIST_LENGTH = 2  # tensors in a sample Tensor[] argument
BATCH = 2  # the batch size of sample tensors under vmap

_TENSOR_TYPES = {
    "Tensor": ("tensor", False),
    "Optional[Tensor]": ("tensor", True),
    "List[Tensor]": ("tensor list", False),
    "List[Optional[Tensor]]": ("tensor list", True),
}
_VALUE_SAMPLES = {
    "int": "0",
    "SymInt": "0",
    "float": "1.0",
    "bool": "False",
    "number": "1",
    "str": "''",
    "Device": "'cpu'",
    "List[int]": "[1]",
    "List[SymInt]": "[1]",
    "List[float]": "[1.0]",
    "List[bool]": "[False]",
    "List[number]": "[1]",
    "List[Optional[number]]": "[1]",
    "List[str]": "['']",
}
_COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_EVAL_SCOPE = {"torch": torch, "inf": math.inf, "nan": math.nan, "device": torch.device}


class SampleError(OpmagicError, ValueError):
    """An argument the explorer cannot build a sample for, or an input that makes no tensor."""


def devices() -> tuple[str, ...]:
    """Devices a sample tensor can live on here: cpu, meta, and cuda when there is one."""
    return ("cpu", "meta", "cuda") if torch.cuda.is_available() else ("cpu", "meta")


@dataclass
class TensorSpec:
    """How to make one sample tensor."""

    device: str = "cpu"
    dtype: str = "float32"
    requires_grad: bool = False
    layout: str = "strided"  # one of LAYOUTS
    view: str = "none"  # one of VIEWS: a lazy conjugate or negative view
    shape: str = "2, 2"  # comma-separated sizes; 2 x 2 suits elementwise ops and matmuls alike

    def build(self, what: str, batch: int | None = None) -> torch.Tensor:
        """The tensor (with a leading ``batch`` dimension for vmap); ``what`` names it in errors."""
        self._check_fields(what)
        dtype = DTYPES[self.dtype]
        self._check(what, dtype)
        shape = _parse_shape(what, self.shape)
        if batch is not None:
            shape = (batch, *shape)
        base_dtype = _COMPLEX_OF[dtype] if self.view == "neg" else dtype
        sparse = self.layout == "sparse"
        device = "cpu" if sparse else self.device  # no meta kernel makes sparse tensors: move them
        try:
            if base_dtype.is_floating_point or base_dtype.is_complex:
                base = torch.randn(shape, dtype=base_dtype, device=device)
            else:
                base = torch.ones(shape, dtype=base_dtype, device=device)
            if self.requires_grad:
                base.requires_grad_()
            tensor = base
            if self.view == "conj":
                tensor = base.conj()
            elif self.view == "neg":
                tensor = base.conj().imag  # the imaginary part of a conjugate: a negative view
            return tensor.to_sparse().to(self.device) if sparse else tensor
        except Exception as exc:  # torch raises many types here (AssertionError without CUDA)
            raise SampleError(f"{what}: torch cannot make this tensor: {exc}") from exc

    def _check_fields(self, what: str) -> None:
        """Each field one of the values the explorer offers (set from code, it may not be)."""
        choices = {"dtype": tuple(DTYPES), "layout": LAYOUTS, "view": VIEWS}
        for name, allowed in choices.items():
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise SampleError(
                    f"{what}: {name} is one of {', '.join(allowed)}; got {value!r:.40}."
                )
        if not isinstance(self.requires_grad, bool):
            raise SampleError(
                f"{what}: requires_grad is True or False; got {self.requires_grad!r:.40}."
            )
        for name in ("device", "shape"):
            if not isinstance(getattr(self, name), str):
                raise SampleError(
                    f"{what}: {name} is a text ('cpu', '2, 3'); got {getattr(self, name)!r:.40}."
                )

    def _check(self, what: str, dtype: torch.dtype) -> None:
        """Combinations torch has no tensor for, each with the fix."""
        if self.view == "conj" and not dtype.is_complex:
            raise SampleError(
                f"{what}: a conjugate view needs a complex dtype; choose complex64 (a conj() "
                "of a real tensor is the tensor itself)."
            )
        if self.view == "neg" and dtype not in _COMPLEX_OF:
            raise SampleError(
                f"{what}: a negative view is made as x.conj().imag, which needs float32 or "
                "float64; choose one of them."
            )
        if self.requires_grad and not (dtype.is_floating_point or dtype.is_complex):
            raise SampleError(
                f"{what}: only floating-point and complex tensors can require grad; choose "
                "float32, or turn requires_grad off."
            )


@dataclass
class ArgumentSlot:
    """One argument of the schema the explorer asks about, and what to pass for it."""

    parameter: OpParameter
    position: int  # index in the schema
    kind: str  # "tensor", "tensor list" or "value"
    optional: bool = False  # a tensor argument that may be None
    present: bool = True  # for optional tensor arguments: pass a tensor (else None)
    tensor: TensorSpec = field(default_factory=TensorSpec)
    value: str = ""  # for "value" slots: a Python expression, torch in scope

    @property
    def name(self) -> str:
        """The argument's name in the schema."""
        return self.parameter.name

    def sample(self, batch: int | None) -> Any:
        """The value to pass (tensors with a leading batch dimension when ``batch`` is set)."""
        what = f"argument {self.name!r}"
        if self.kind == "value":
            return _evaluate(what, self.value)
        if not self.present:
            return None
        if self.kind == "tensor list":
            return [self.tensor.build(f"{what}[{i}]", batch) for i in range(LIST_LENGTH)]
        return self.tensor.build(what, batch)


def plan_arguments(parameters: Sequence[OpParameter]) -> list[ArgumentSlot]:
    """A slot for every tensor argument and every other argument without a default."""
    slots = []
    for position, param in enumerate(parameters):
        tensor_type = _TENSOR_TYPES.get(param.type)
        if tensor_type is not None:
            kind, optional = tensor_type
            present = not (optional and param.has_default)
            slots.append(ArgumentSlot(param, position, kind, optional, present))
        elif not param.has_default:
            slots.append(ArgumentSlot(param, position, "value", value=_value_sample(param)))
    return slots


def call_arguments(
    slots: Sequence[ArgumentSlot], batch: int | None = None
) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` for the call: positional until an argument is left to its default."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for slot in slots:
        value = slot.sample(batch)
        if not slot.parameter.kwarg_only and slot.position == len(args) and not kwargs:
            args.append(value)
        else:
            kwargs[slot.name] = value
    return tuple(args), kwargs


def _value_sample(param: OpParameter) -> str:
    """The expression a required non-tensor argument starts with."""
    if param.type.startswith("Optional["):
        return "None"
    sample = _VALUE_SAMPLES.get(param.type)
    if sample is None:
        raise SampleError(
            f"The explorer cannot build a sample for argument {param.name!r} of type "
            f"{param.type}. Pick another overload, or call opmagic.resolve(op, ...) with "
            "arguments of your own."
        )
    return sample


def _parse_shape(what: str, text: str) -> tuple[int, ...]:
    """``"2, 3"`` -> ``(2, 3)``; an empty text is a 0-dim tensor."""
    try:
        sizes = tuple(
            int(part) for part in text.replace("(", "").replace(")", "").split(",") if part.strip()
        )
    except ValueError:
        sizes = (-1,)
    if any(size < 0 for size in sizes):
        raise SampleError(f"{what}: the shape {text!r} is not a list of sizes like '2, 3'.")
    return sizes


def _evaluate(what: str, expression: str) -> Any:
    """A value typed as a Python expression (``torch``, ``inf`` and ``nan`` in scope)."""
    try:
        return eval(expression, dict(_EVAL_SCOPE))
    except Exception as exc:  # whatever the user typed: report it, never raise into widgets
        raise SampleError(
            f"{what}: could not evaluate {expression!r} ({type(exc).__name__}: {exc}). "
            "Type a Python expression such as 1, 2.5, [2, 3] or torch.float32."
        ) from exc
