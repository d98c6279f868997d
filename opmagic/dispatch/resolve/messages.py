"""The words of a resolution: the tensors and values in words, and why a call fails (the
words about keys and thread-local state are in :mod:`.origins`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..ops import OpRef


def describe_tensor(t: torch.Tensor) -> str:
    """A tensor in the words that matter to dispatch: ``Tensor(float32, cpu, [2], conj)``."""
    detail = [str(t.dtype).removeprefix("torch."), str(t.device)]
    if t.layout != torch.strided:
        detail.append(str(t.layout).removeprefix("torch."))
    detail.append(str(list(t.shape)) if not t.is_nested else "nested")
    flags = (
        ("requires_grad", t.requires_grad),
        ("inference", t.is_inference()),
        ("conj", t.is_conj()),
        ("neg", t.is_neg()),
    )
    detail.extend(name for name, on in flags if on)
    kind = "Tensor" if type(t) is torch.Tensor else type(t).__name__
    return f"{kind}({', '.join(detail)})"


def missing_kernel_message(op: str, key: str) -> str:
    """Why a call that reaches ``key`` without a kernel fails, and what to register."""
    if key == "Undefined":
        return (
            f"no kernel can be found: the call has no tensor inputs to pick a backend from, "
            f"and {op} has no CompositeExplicitAutograd or CompositeImplicitAutograd kernel "
            "for the Undefined slot. Give it a tensor argument, a device argument with a "
            "BackendSelect kernel, or a CompositeExplicitAutograd kernel."
        )
    return (
        f"no kernel for {key}: {op} has no {key} kernel and {key} has no fallback, so the "
        f"dispatcher raises NotImplementedError (\"Could not run '{op}' with arguments from "
        f"the '{key}' backend\"). Register a {key} kernel, or one for an alias key that covers "
        "it (CompositeExplicitAutograd for every backend, Autograd for every autograd key)."
    )


def ambiguous_kernel_message(op: str) -> str:
    """Why a call that reaches an ambiguous AutogradOther entry fails."""
    return (
        f"{op} has a CompositeImplicitAutograd kernel and a kernel for a backend "
        "under AutogradOther: the dispatcher cannot pick one and raises. Register an "
        "Autograd kernel (or CompositeExplicitAutograd) to disambiguate."
    )


def no_fake_message(op: str) -> str:
    """Why a call on meta or fake tensors fails when the op has no Meta kernel or fake impl."""
    return (
        f"no Meta kernel or fake impl: {op} has neither, so running it on meta tensors raises "
        "NotImplementedError. Register a fake impl (torch.library.register_fake) or a Meta kernel."
    )


def no_device_kernel_message(ref: OpRef, device: str) -> str:
    """Why custom_op's device router raises for a device the op has no kernel for."""
    return (
        f"{ref} has no kernel for device '{device}', so its BackendSelect "
        f"kernel raises. Register one with "
        f"{ref.name}.register_kernel('{device}')."
    )


# ---------------------------------------------------------------- arguments


def value_words(value: Any) -> str:
    """A value in a few words for messages: ``Tensor``, ``list[Tensor, int 2]``, ``str 'a'``."""
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(value_words(v) for v in value[:3])
        return f"{type(value).__name__}[{inner}{', ...' if len(value) > 3 else ''}]"
    return f"{type(value).__name__} {value!r}"[:60]


def type_words(schema_type: str) -> str:
    """A schema type as words: ``a float``, ``a list of Tensors``, ``an int or None``."""
    if schema_type.startswith("Optional[") and schema_type.endswith("]"):
        return f"{type_words(schema_type[9:-1])} or None"
    if schema_type.startswith("List[") and schema_type.endswith("]"):
        item = type_words(schema_type[5:-1]).split(" ", 1)[1]
        plural = item.replace(" or None", "s (or None)") if "or None" in item else f"{item}s"
        return f"a list of {plural}"
    name = {"number": "number (Scalar)", "ScalarType": "dtype"}.get(schema_type, schema_type)
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def argument_type_message(
    ref: OpRef,
    schema: Any,
    name: str | None,
    schema_type: str | None,
    value: Any,
    torch_words: str,
) -> str:
    """Why torch refuses an argument of the wrong type, before any kernel runs."""
    if name is None or schema_type is None:
        return (
            f'{ref} refuses these arguments: the real call raises "{torch_words}". '
            f"Pass arguments that match its schema: {schema}"
        )
    fix = (
        "Wrap numbers with torch.tensor(...) or pick an overload that takes a Scalar."
        if "Tensor" in schema_type
        else f"Pass {type_words(schema_type)}."
    )
    return (
        f"Argument {name!r} of {ref} must be {type_words(schema_type)}, got "
        f'{value_words(value)}: the real call raises "{torch_words}" before any kernel '
        f"runs. {fix}\nSchema: {schema}"
    )


def no_overload_message(ref: OpRef, args: tuple, kwargs: dict, schemas: Sequence[str]) -> str:
    """Why a packet call matches none of its overloads."""
    given = ", ".join(
        [value_words(a) for a in args] + [f"{k}={value_words(v)}" for k, v in kwargs.items()]
    )
    listed = "\n  ".join(schemas)
    return (
        f"No overload of {ref.qualname} accepts ({given}). Its overloads are:\n  {listed}\n"
        f"Pass arguments matching one of them, or name one ('{ref.qualname}.<overload>')."
    )


def too_many_positional_message(ref: OpRef, schema: Any, given: int) -> str:
    """Why a call with more positional arguments than the schema has fails."""
    positional = sum(1 for p in schema.arguments if not p.kwarg_only)
    return f"{ref} takes at most {positional} positional arguments, got {given}.\nSchema: {schema}"


def unknown_keyword_message(ref: OpRef, schema: Any, unknown: Sequence[str]) -> str:
    """Why a call with a keyword the schema lacks fails."""
    return f"{ref} has no argument named {', '.join(map(repr, unknown))}.\nSchema: {schema}"


def both_ways_message(ref: OpRef, name: str) -> str:
    """Why a call passing one argument by position and by keyword fails."""
    return f"{ref} got argument {name!r} both by position and by keyword."


def missing_argument_message(ref: OpRef, schema: Any, name: str) -> str:
    """Why a call without a required argument fails."""
    return f"{ref} is missing the required argument {name!r}.\nSchema: {schema}"


# ---------------------------------------------------------------- Python handlers


def fake_mode_real_tensor_message(op: str, argument: str) -> str:
    """Why FakeTensorMode refuses a call that mixes a real tensor in."""
    return (
        f"argument {argument} of {op} is a real tensor, and FakeTensorMode refuses real "
        'tensors (AssertionError: "Please convert all Tensors to FakeTensors first"). '
        "Convert it with mode.from_tensor(...), or make the mode with "
        "FakeTensorMode(allow_non_fake_inputs=True)."
    )


def functional_tensor_alone_message(op: str) -> str:
    """Why a FunctionalTensor outside its FunctionalTensorMode fails."""
    return (
        f"a FunctionalTensor reaches {op} outside FunctionalTensorMode, and "
        'FunctionalTensor.__torch_dispatch__ raises ("Attempting to use FunctionalTensor on '
        'its own"). Call the op inside the mode (dispatch_functionalize does that).'
    )


def no_jagged_rule_message(op: str) -> str:
    """Why a jagged NestedTensor argument fails for an op it has no rule for."""
    return (
        f"the jagged NestedTensor has no rule for {op} and the op has no "
        "CompositeImplicitAutograd(NestedTensor) kernel to fall back on, so "
        f"NestedTensor.__torch_dispatch__ raises NotImplementedError({op}). Register a "
        "CompositeImplicitAutograd kernel, or unbind the nested tensor and call the op "
        "per component."
    )


def jagged_refuses_message(op: str, exc: BaseException) -> str:
    """Why the jagged NestedTensor's pointwise rule refuses these arguments."""
    return (
        f"the jagged NestedTensor's rule for {op} refuses these arguments "
        f"({type(exc).__name__}: {exc}). Pass nested tensors of the same structure."
    )


# ---------------------------------------------------------------- fallbacks that refuse


def math_bit_mixed_aliasing_message(op: str, key: str) -> str:
    """Why the Conjugate/Negative/ZeroTensor fallback refuses an op mixing writes and views."""
    return (
        f"the {key} fallback refuses {op}: its aliased arguments mix written (Tensor(a!)) and "
        "viewed (Tensor(a)) ones, which the fallback cannot handle (RuntimeError). Register "
        f"a {key} kernel for the op, or materialise the input first (.resolve_conj(), "
        ".resolve_neg(), .clone())."
    )


def math_bit_written_list_message(op: str, key: str) -> str:
    """Why the Conjugate/Negative fallback refuses a flagged tensor in a written list."""
    return (
        f"the {key} fallback refuses {op}: a written Tensor[] holds a {key.lower()} view, and "
        "the fallback does not support mutable tensor lists with one (RuntimeError). "
        "Materialise the list's tensors first (.resolve_conj() / .resolve_neg())."
    )


def math_bit_too_many_written_message(op: str, key: str) -> str:
    """Why the Conjugate/Negative fallback refuses two written flagged tensors."""
    return (
        f"the {key} fallback refuses {op}: more than one written argument is a "
        f"{key.lower()} view (RuntimeError). Materialise them first "
        "(.resolve_conj() / .resolve_neg())."
    )


def math_bit_not_returned_message(op: str, key: str, argument: str) -> str:
    """Why the Conjugate/Negative fallback fails after an op writing a flagged input ran."""
    return (
        f"the {key} fallback fails after {op} ran: argument {argument} is a "
        f"{key.lower()} view the op writes to, so the fallback ran the op on a materialised "
        "copy and copies the op's first return back into it, but the op does not return "
        f'{argument} first (-> () raises "Expected Tensor but got None", another return '
        "an internal assert). Materialise the input first (.resolve_conj() / "
        f".resolve_neg()), or make the op return {argument} first (Tensor(a!))."
    )


def zero_tensor_written_message(op: str, argument: str) -> str:
    """Why the ZeroTensor fallback refuses an op that writes to a ZeroTensor."""
    return (
        f"argument {argument} of {op} is a ZeroTensor the op writes to, and ZeroTensors are "
        'immutable: the ZeroTensor fallback raises ("ZeroTensors are immutable"). Pass a '
        "materialised tensor (.clone()) instead."
    )


def functionalize_alias_message(op: str) -> str:
    """Why the functionalization fallback refuses an op with alias annotations."""
    return (
        f"functionalization refuses {op}: it has no Functionalize kernel, and the fallback "
        "cannot functionalize an op whose schema has alias annotations (Tensor(a!) / "
        "Tensor(a); custom_op's mutates_args makes them): RuntimeError \"Found a custom "
        '(non-ATen) operator whose output has alias annotations". Make the op functional '
        "(return new tensors), or run it under Python functionalization "
        "(torch.compile, dispatch_functionalize), which auto-functionalizes mutable ops."
    )


def vmap_cannot_generate_message(op: str, reason: str) -> str:
    """Why vmap's per-sample fallback refuses an op it cannot loop over at all."""
    return (
        f"vmap has no batching rule for {op} and its per-sample fallback refuses it: {reason} "
        '(RuntimeError "Batching rule not implemented ... We could not generate a '
        'fallback"). Register a vmap rule (torch.library.register_vmap) or a '
        "FuncTorchBatched kernel."
    )


def vmap_refuses_message(op: str, reason: str) -> str:
    """Why vmap's per-sample fallback refuses a mutating, viewing or empty-returning op."""
    return (
        f"vmap has no batching rule for {op} and its per-sample fallback refuses it: "
        f'{reason} (RuntimeError "Batching rule not implemented"). Register a vmap rule '
        "(torch.library.register_vmap) or a FuncTorchBatched kernel."
    )


def vmap_inplace_message(op: str, argument: str) -> str:
    """Why vmap refuses an in-place op whose self is not batched where another argument is."""
    return (
        f"vmap cannot run {op} in place: argument {argument} is batched at a vmap level "
        'where self is not, so it has more elements than self (RuntimeError "vmap: ... is '
        'not possible"). Use the out-of-place op, or vmap over self as well.'
    )


def vmap_fallback_disabled_message(op: str) -> str:
    """Why vmap fails for an op without a batching rule when the fallback is switched off."""
    return (
        f"vmap has no batching rule for {op} and its per-sample fallback is switched off "
        "(torch._C._functorch._set_vmap_fallback_enabled(False)). Turn it back on, or "
        "register a vmap rule (torch.library.register_vmap)."
    )


def must_override_setup_context_message(op: str) -> str:
    """Why a custom_op's autograd kernel raises under torch.func.grad/vjp/jacrev."""
    return (
        f"{op} is a torch.library.custom_op, and its autograd kernel runs an "
        "autograd.Function that torch.func transforms refuse: under grad, vjp or jacrev, "
        'with an input that requires grad, torch raises "In order to use an autograd.Function '
        "with functorch transforms (vmap, grad, jvp, jacrev, ...), it must override the "
        'setup_context staticmethod", register_autograd or not. Use torch.autograd.grad '
        "outside torch.func, or write the op as a torch.autograd.Function with "
        "setup_context and vmap staticmethods."
    )


def fallthrough_reached_message(op: str, key: str) -> str:
    """Why a call whose keyset leaves only a fallthrough kernel fails."""
    where = (
        "the Undefined slot (every backend of the call was a fallthrough, so no key is left)"
        if key == "Undefined"
        else f"{key}"
    )
    return (
        f"{op} reaches a fallthrough kernel at {where}: a fallthrough registered to an alias "
        "key (CompositeExplicitAutograd, CompositeImplicitAutograd) fills the backend slots "
        "and Undefined with it, and the dispatcher runs it there, which raises an internal "
        'assert ("fallthrough_kernel was executed"). Register fallthroughs to runtime keys '
        "only, and give the op a real kernel for its backends."
    )
