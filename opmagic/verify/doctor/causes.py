"""The closed set of causes the doctor reports, and how an exception maps onto one.

Each cause is a short code (``no-fake``, ``fake-strides``, ...) with a line on what is wrong;
docs/doctor.md lists them with their fixes. A rung that fails classifies its exception with
:func:`classify`; what no code explains is ``compile-failure`` or ``export-failure``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..._torch import compilers


@dataclass(frozen=True)
class Cause:
    """One cause: its code and what it means."""

    code: str
    meaning: str


CAUSES: dict[str, Cause] = {
    cause.code: cause
    for cause in (
        Cause(
            "composite-shadows", "a CompositeImplicitAutograd kernel hides the op's other kernels"
        ),
        Cause("mutation-undeclared", "the kernel mutates an argument the schema says it does not"),
        Cause("mutation-overdeclared", "the schema says the kernel mutates an argument it leaves"),
        Cause("output-aliases-input", "an output is (a view of) an input"),
        Cause("fake-signature", "the fake impl does not take the op's arguments"),
        Cause("no-fake", "the op has no fake (meta) impl: FakeTensor, compile and export fail"),
        Cause("fake-shape", "the fake impl's output shape differs from the kernel's"),
        Cause("fake-strides", "the fake impl's output strides differ from the kernel's"),
        Cause("fake-dtype", "the fake impl's output dtype differs from the kernel's"),
        Cause("fake-device", "the fake impl's output device differs from the kernel's"),
        Cause("fake-raises", "the fake impl raises on inputs the kernel takes"),
        Cause(
            "data-dependent-shape",
            "an output size depends on the input's values, and the fake impl does not say so",
        ),
        Cause("no-autograd", "inputs require grad, but the op has no autograd formula"),
        Cause("backward-arity", "the backward returns a gradient per input in the wrong number"),
        Cause("backward-wrong", "the backward's gradients differ from the numerical ones"),
        Cause("vmap-wrong", "the vmap rule's result differs from the op run sample by sample"),
        Cause("stream-unsafe", "the kernel ignores the current CUDA stream"),
        Cause("graph-unsafe", "the op cannot be captured in a CUDA graph"),
        Cause(
            "compile-failure", "torch.compile fails or differs, for a reason no other code names"
        ),
        Cause(
            "export-failure", "torch.export or AOTInductor fails or differs, otherwise unexplained"
        ),
    )
}


def classify(error: BaseException) -> str | None:
    """The cause an exception raised while running the op shows, or ``None``."""
    text = str(error)
    if isinstance(error, compilers.no_fake_kernel_errors()) or re.search(
        r"no fake impl registered|does not have a (meta|fake)|no meta kernel|"
        r"NotImplementedError: .*Meta|could not run .* with arguments from the 'Meta' backend",
        text,
        re.IGNORECASE,
    ):
        return "no-fake"
    if isinstance(error, compilers.data_dependent_errors()) or re.search(
        r"data-dependent|DataDependentOutputException|DynamicOutputShapeException", text
    ):
        return "data-dependent-shape"
    if re.search(r"is not defined as mutable but was mutated", text):
        return "mutation-undeclared"
    if re.search(
        r"may not alias any inputs|must not also be an input|is not defined to alias", text
    ):
        return "output-aliases-input"
    if re.search(r"incorrect number of gradients|a gradient different than None at position", text):
        return "backward-arity"
    if re.search(
        r"no autograd formula was registered|autograd kernel was not registered|"
        r"does not have an autograd kernel defined at an autograd key",
        text,
    ):
        return "no-autograd"
    return None
