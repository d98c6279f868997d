"""What a trace keeps of a call's arguments: tensors as :class:`TensorInfo`, small values as
they are, read from what the observer logged (or from Python's summaries).

The operator behind a reported call is looked up once per overload (:func:`op_info`): its
schema parameters, which arguments ``BackendSelect`` reads, and which ints are enums
(``ScalarType``, ``Layout``, ``MemoryFormat``) that the observer reports as numbers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..._torch import dispatcher, op_observer
from ..ops import OpParameter, op_parameters, op_ref

_DTYPE_SHORT = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "b8",
    "complex64": "c64",
    "complex128": "c128",
}


class TensorInfo(NamedTuple):
    """What a tensor argument looked like: the trace keeps no tensors alive."""

    type: str  # "Tensor", or the subclass's name
    dtype: str  # "float32"
    device: str  # "cpu", "meta", ...
    shape: tuple[int, ...] | None  # None for a nested tensor (no one shape)
    requires_grad: bool

    def __str__(self) -> str:
        shape = "nested" if self.shape is None else ",".join(map(str, self.shape))
        text = f"{_DTYPE_SHORT.get(self.dtype, self.dtype)}[{shape}]"
        if self.device != "cpu":
            text += f"@{self.device}"
        if self.requires_grad:
            text += " grad"
        return text if self.type == "Tensor" else f"{self.type}({text})"


class OpInfo(NamedTuple):
    """What the tracer needs of one operator overload, looked up once."""

    overload: Any  # the OpOverload
    label: str  # "aten::add.Tensor"
    parameters: tuple[OpParameter, ...]
    selectors: tuple[int, ...]  # positions of device/dtype/layout arguments (BackendSelect)
    enums: tuple[tuple[int, tuple[Any, ...]], ...]  # (position, objects by value) of enum args
    views: bool  # every output is a view of an input (returns ``Tensor(a)``, not written)


class Summarised(tuple):
    """Argument summaries Python made (a call whose path Python code decides)."""


_ops: dict[tuple[str, str], OpInfo] = {}


def op_info(name: str, overload: str) -> OpInfo:
    """The operator behind a reported call (looked up once per overload)."""
    found = _ops.get((name, overload))
    if found is None:
        namespace, _, short = name.partition("::")
        packet = getattr(getattr(torch.ops, namespace), short)
        op = getattr(packet, overload or "default")
        parameters = op_parameters(op_ref(op))
        selectors = tuple(
            i for i, p in enumerate(parameters) if p.name in ("device", "dtype", "layout")
        )
        tables = op_observer.enum_tables()
        schema = dispatcher.find_schema(name, overload)
        real_types = [str(arg.real_type) for arg in schema.arguments] if schema else []
        enums = tuple(  # the schema says "int" for these; the real type names the enum
            (i, tables[kind])
            for i, real in enumerate(real_types)
            for kind in tables
            if real in (kind, f"Optional[{kind}]")
        )
        returns = list(schema.returns) if schema else []
        views = bool(returns) and all(
            r.alias_info is not None and not r.alias_info.is_write for r in returns
        )
        found = _ops[(name, overload)] = OpInfo(
            op, f"{name}.{overload}" if overload else name, parameters, selectors, enums, views
        )
    return found


def call_arguments(info: OpInfo, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The call's arguments from what the observer reported: a boxed call reports its whole
    stack (a fallback's own values below the call's), so the arguments are the last ones;
    dtype, layout and memory-format ints become torch objects again."""
    if len(inputs) > len(info.parameters):
        inputs = inputs[len(inputs) - len(info.parameters) :]
    if not info.enums:
        return inputs
    values = list(inputs)
    for position, objects in info.enums:
        value = values[position] if position < len(values) else None
        if isinstance(value, int) and 0 <= value < len(objects):
            values[position] = objects[value]
    return tuple(values)


def logged_arguments(info: OpInfo, logged: Any) -> tuple[Any, ...]:
    """Arguments as the trace keeps them, from the log: Python's summaries as they are, the
    observer's (``(kinds, values)``, ``t`` a tensor, ``l`` a tensor list, ``v`` a value)
    turned into TensorInfo and plain values."""
    if isinstance(logged, Summarised):
        return tuple(logged)
    kinds, values = logged
    return call_arguments(
        info,
        tuple(
            _logged_tensor(value)
            if kind == "t"
            else tuple(_logged_tensor(v) for v in value)
            if kind == "l"
            else _summary(value)
            for kind, value in zip(kinds, values, strict=True)
        ),
    )


def _logged_tensor(logged: tuple[Any, ...] | None) -> TensorInfo | None:
    """The observer's ``(dtype, device, shape, requires_grad)`` of a tensor as a TensorInfo."""
    if logged is None:
        return None
    dtype, device, shape, requires_grad = logged
    return TensorInfo("Tensor", str(dtype).removeprefix("torch."), device, shape, requires_grad)


def summaries(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments as the trace keeps them: tensors summarised, small values as they are."""
    return tuple(_summary(value) for value in inputs)


_PLAIN_VALUES = (
    bool,
    int,
    float,
    complex,
    str,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _summary(value: Any) -> Any:
    """One argument as the trace keeps it: a TensorInfo, a tuple, a plain value or its type."""
    if isinstance(value, torch.Tensor):
        try:
            shape: tuple[int, ...] | None = tuple(value.shape)
        except RuntimeError:  # nested tensors have no single shape
            shape = None
        kind = type(value)
        return TensorInfo(
            "Tensor" if kind is torch.Tensor else kind.__name__,
            str(value.dtype).removeprefix("torch."),
            value.device.type,
            shape,
            value.requires_grad,
        )
    if isinstance(value, TensorInfo):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_summary(v) for v in value)
    if value is None or isinstance(value, _PLAIN_VALUES):
        return value
    return f"<{type(value).__name__}>"


def same_value(value: Any, default: Any) -> bool:
    """Whether a kept argument equals its schema default (a list default matches a tuple)."""
    try:
        return bool(value == default) or (isinstance(default, list) and value == tuple(default))
    except Exception:  # values that do not compare (e.g. a summary with a tensor default)
        return False


def short_value(value: Any) -> str:
    """A kept argument for a call's one-line inputs: ``bfloat16``, ``[1,2]``, ``2``."""
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return "[" + ",".join(short_value(v) for v in value) + "]"
    return str(value)
