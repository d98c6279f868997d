"""Fixes as code to paste: a fake impl inferred from what the kernel returned, the option or
schema that declares a mutation, a ``.clone()`` on the kernel's return, a backward's return.

Every fix is written in the words of the place the op came from: a ``%%custom_op`` cell's
companions (``@fake``, ``--mutates-args``), ``torch.library`` calls for other Python ops, and
the schema for ops defined elsewhere (C++).
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from collections.abc import Sequence
from typing import Any

import torch

from ..._torch import custom_op_state
from ...dispatch.sites import label_location
from .target import Target

_MAGIC_CELLS = ("# %%custom_op", "# %%triton_op")


def from_magic_cell(target: Target) -> str | None:
    """``"%%custom_op"`` or ``"%%triton_op"`` when the op is a cell magic's (its companions
    are written ``@fake``, ``@backward``, ...), else ``None``."""
    if target.opdef is None:
        return None
    code = getattr(custom_op_state.custom_op_function(target.opdef), "__code__", None)
    first = linecache.getline(code.co_filename, 1) if code is not None else ""
    for magic in _MAGIC_CELLS:
        if first.startswith(magic):
            return magic.removeprefix("# ")
    return None


def companion(target: Target, kind: str) -> str:
    """The decorator line that registers a ``kind`` (``fake``, ``backward``) for the op."""
    if from_magic_cell(target):
        return f"@{kind}"
    if kind == "fake":
        return f'@torch.library.register_fake("{target.qualname}")'
    return f'# torch.library.register_autograd("{target.qualname}", backward, setup_context=...)'


def parameters(target: Target) -> str:
    """The op's arguments as a Python parameter list: ``x, y, *, alpha``."""
    positional = [a.name for a in target.schema.arguments if not a.kwarg_only]
    keyword = [a.name for a in target.schema.arguments if a.kwarg_only]
    return ", ".join(positional + (["*", *keyword] if keyword else []))


# ---------------------------------------------------------------- fake impls


def fake_impl(target: Target, samples: Sequence[Any], outputs: Sequence[Any]) -> str:
    """A fake impl for the op, inferred from its real outputs on the samples: each output's
    sizes named after the input sizes they equal in every sample (a size that changes between
    same-shape inputs is a data-dependent size), its dtype and layout after an input's."""
    lines = [companion(target, "fake"), f"def _({parameters(target)}):"]
    firsts = [_flat(output) for output in outputs]
    if not firsts or firsts[0] is None:
        lines.append("    ...  # build outputs like the kernel's (they are not plain tensors)")
        return "\n".join(lines)
    body: list[str] = []
    results = []
    for index in range(len(firsts[0])):
        per_sample = [flat[index] for flat in firsts if flat is not None and index < len(flat)]
        results.append(_output_expression(target, samples, per_sample, body))
    lines += [f"    {line}" for line in body]
    if not results:
        lines.append("    return None")
    else:
        lines.append(f"    return {', '.join(results)}")
    return "\n".join(lines)


def _flat(output: Any) -> list[torch.Tensor] | None:
    """The op's outputs as a list of tensors (``[]`` for none); ``None`` for lists of them."""
    if output is None:
        return []
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, tuple) and all(isinstance(o, torch.Tensor) for o in output):
        return list(output)
    return None


def _output_expression(
    target: Target, samples: Sequence[Any], outputs: Sequence[torch.Tensor], body: list[str]
) -> str:
    """The expression making one fake output (``torch.empty_like(x)``, ``x.new_empty(...)``)."""
    first = outputs[0]
    template = _template(target, samples, outputs)
    if template is None:
        sizes = _sizes(target, samples, outputs, body)
        return f"torch.empty({sizes}, dtype={first.dtype})"
    name, inputs = template
    if all(
        o.shape == i.shape and o.stride() == i.stride()
        for o, i in zip(outputs, inputs, strict=True)
    ):
        return f"torch.empty_like({name})"
    sizes = _sizes(target, samples, outputs, body)
    order = _memory_order(first)
    if order is None or order == sorted(order):
        return f"{name}.new_empty({sizes})"
    inverse = [order.index(dim) for dim in range(len(order))]
    permuted = _tuple([_split_sizes(sizes)[d] for d in order])
    return f"{name}.new_empty({permuted}).permute({', '.join(map(str, inverse))})"


def _template(
    target: Target, samples: Sequence[Any], outputs: Sequence[torch.Tensor]
) -> tuple[str, list[torch.Tensor]] | None:
    """The first tensor argument with the outputs' dtype and device in every sample."""
    for position, argument in enumerate(target.schema.arguments):
        inputs = [_argument(sample, position, argument.name) for sample in samples]
        if all(
            isinstance(i, torch.Tensor) and i.dtype == o.dtype and i.device == o.device
            for i, o in zip(inputs, outputs, strict=True)
        ):
            return argument.name, inputs
    return None


def _argument(sample: Any, position: int, name: str) -> Any:
    """A sample's value for the schema argument at ``position`` named ``name``."""
    if position < len(sample.args):
        return sample.args[position]
    return sample.kwargs.get(name)


def _sizes(
    target: Target, samples: Sequence[Any], outputs: Sequence[torch.Tensor], body: list[str]
) -> str:
    """The outputs' sizes as a tuple expression, each dim named after an input size equal to it
    in every sample, a constant, or a data-dependent size (a line added to ``body``)."""
    parts = []
    for dim in range(outputs[0].dim()):
        sizes = [o.shape[dim] for o in outputs]
        parts.append(_size_expression(target, samples, sizes, dim, body))
    return _tuple(parts)


def _tuple(parts: Sequence[str]) -> str:
    """A tuple expression of ``parts``: ``(a, b)``, ``(a,)``, ``()``."""
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _split_sizes(sizes: str) -> list[str]:
    """The parts of a sizes tuple expression made by :func:`_sizes`."""
    return [part.strip() for part in sizes.strip("()").split(",") if part.strip()]


def _size_expression(
    target: Target, samples: Sequence[Any], sizes: list[int], dim: int, body: list[str]
) -> str:
    """One output size: ``x.shape[0]``, ``3``, or a new data-dependent size ``n``."""
    candidates = []
    for position, argument in enumerate(target.schema.arguments):
        inputs = [_argument(sample, position, argument.name) for sample in samples]
        if not all(isinstance(i, torch.Tensor) for i in inputs):
            continue
        for input_dim in range(inputs[0].dim()):
            if all(
                i.dim() > input_dim and i.shape[input_dim] == s
                for i, s in zip(inputs, sizes, strict=True)
            ):
                candidates.append(
                    (input_dim != dim, position, f"{argument.name}.shape[{input_dim}]")
                )
    if candidates:
        return min(candidates)[2]
    if len(set(sizes)) == 1 and len(samples) > 1:
        return str(sizes[0])
    name = f"n{len([line for line in body if 'new_dynamic_size' in line])}"
    if not any("get_ctx" in line for line in body):
        body.append("ctx = torch.library.get_ctx()")
    body.append(f"{name} = ctx.new_dynamic_size()  # the size depends on the data")
    return name


def _memory_order(tensor: torch.Tensor) -> list[int] | None:
    """The dims from outermost to innermost in memory, when the tensor is dense."""
    if tensor.dim() == 0 or not _is_dense(tensor):
        return None
    return sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d))


def _is_dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor is a permutation of a contiguous tensor."""
    order = sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d))
    expected = 1
    for dim in reversed(order):
        if tensor.shape[dim] != 1 and tensor.stride(dim) != expected:
            return False
        expected *= tensor.shape[dim]
    return True


def fake_signature(target: Target) -> str:
    """The fake impl's first lines, taking the op's arguments."""
    return f"{companion(target, 'fake')}\ndef _({parameters(target)}):"


# ---------------------------------------------------------------- mutations and aliases


def declare_mutations(target: Target, mutated: Sequence[str]) -> str:
    """The definition declaring exactly ``mutated`` as mutated arguments."""
    names = sorted(mutated)
    magic = from_magic_cell(target)
    if magic:
        option = f" --mutates-args {','.join(names)}" if names else ""
        return f"{magic} {target.qualname}{option}"
    if target.opdef is not None:
        value = "{" + ", ".join(f'"{n}"' for n in names) + "}" if names else "()"
        return f'@torch.library.custom_op("{target.qualname}", mutates_args={value})'
    return f'lib.define("{_schema_with_mutations(target, set(names))}")'


def _schema_with_mutations(target: Target, mutated: set[str]) -> str:
    """The op's schema (name and overload left out) with ``mutated`` marked ``(a!)``."""
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    arguments = []
    for argument in target.schema.arguments:
        text = str(argument)
        kind, _, rest = text.partition(" ")
        bare = kind.split("(")[0]
        if argument.name in mutated:
            text = f"{bare}({next(letters)}!) {rest}"
        elif argument.alias_info is not None and argument.alias_info.is_write:
            text = f"{bare} {rest}"
        arguments.append(text)
    keyword = [i for i, a in enumerate(target.schema.arguments) if a.kwarg_only]
    if keyword:
        arguments.insert(keyword[0], "*")
    returns = ", ".join(str(r) for r in target.schema.returns)
    returns = f"({returns})" if len(target.schema.returns) != 1 else returns
    name = target.name.partition("::")[2]
    return f"{name}({', '.join(arguments)}) -> {returns}"


def cloned_return(kernel: Any) -> tuple[str, str] | None:
    """``(site, fix)`` for a Python kernel that returns (a view of) an input: its return line
    and that line returning a copy. ``None`` when the kernel's source cannot be read or it has
    several returns."""
    kernel = custom_op_state.unwrap_registered_function(kernel)
    code = getattr(kernel, "__code__", None)
    try:
        source = textwrap.dedent(inspect.getsource(kernel))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    returns = [node for node in ast.walk(tree) if isinstance(node, ast.Return) and node.value]
    if code is None or len(returns) != 1:
        return None
    value = returns[0].value
    expression = ast.unparse(value)
    if not isinstance(value, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
        expression = f"({expression})"
    line = code.co_firstlineno + returns[0].lineno - 1
    return label_location(code.co_filename, line), f"return {expression}.clone()"


# ---------------------------------------------------------------- autograd


def backward_return(target: Target) -> str:
    """The backward's return: a gradient per input, ``None`` for those that are not tensors."""
    grads = []
    for argument in target.schema.arguments:
        tensor = str(argument.type).startswith(("Tensor", "Optional[Tensor]"))
        grads.append(f"grad_{argument.name}" if tensor else "None")
    names = ", ".join(target.argument_names)
    return f"return {', '.join(grads)}  # one per input ({names}); None where there is none"


def autograd_skeleton(target: Target) -> str:
    """A setup_context and backward pair to fill in, returning a gradient per input."""
    tensors = [a.name for a in target.schema.arguments if str(a.type).startswith("Tensor")]
    saved = ", ".join(tensors)
    magic = from_magic_cell(target)
    setup = "@setup_context" if magic else "def setup_context(ctx, inputs, output):"
    lines = [setup] if not magic else [setup, "def _(ctx, inputs, output):"]
    lines += [
        f"    {', '.join(target.argument_names)} = inputs",
        f"    ctx.save_for_backward({saved})",
        "",
        "@backward" if magic else "def backward(ctx, grad):",
    ]
    if magic:
        lines.append("def _(ctx, grad):")
    lines += [
        f"    {saved}{',' if len(tensors) == 1 else ''} = ctx.saved_tensors",
        "    ...  # the gradient of each input from grad",
        f"    {backward_return(target)}",
    ]
    if not magic:
        lines += [
            "",
            f'torch.library.register_autograd("{target.qualname}", backward, '
            "setup_context=setup_context)",
        ]
    return "\n".join(lines)
