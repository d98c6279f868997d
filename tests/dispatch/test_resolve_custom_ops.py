"""``torch.library.custom_op`` operators under torch.func transforms and autocast, against
the real dispatcher.

custom_op's own kernels stay; probes sit on top at CPU (and ADInplaceOrView) so the log
shows where the call went. Under ``torch.func.grad``/``vjp``/``jacrev`` custom_op's
autograd kernel raises, ``register_autograd`` or not; its autocast rule (and
``torch.library.register_autocast``'s on a plain op) casts floating inputs, and the cast
copies carry their own keys (inference tensors under inference_mode).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from .ground_truth import CONTEXTS, PassThroughMode, check_against_dispatcher
from .probes import ProbeOp, make_probe_op, probe_custom_op

pytestmark = pytest.mark.matrix  # a stratified sample runs in the fast loop (tests/conftest.py)

_names = itertools.count()


def custom_op_probe(
    keys: list[str], backward: bool = False, autocast: torch.dtype | None = None
) -> ProbeOp:
    """``opmagic_test_custom::opN(Tensor x, Tensor y) -> Tensor`` with probes at ``keys``."""

    @torch.library.custom_op(f"opmagic_test_custom::op{next(_names)}", mutates_args=())
    def op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    if backward:
        op.register_autograd(
            lambda ctx, grad: (grad, grad), setup_context=lambda ctx, inputs, output: None
        )
    if autocast is not None:
        op.register_autocast("cpu", autocast)
    return probe_custom_op(op, keys)


# ---------------------------------------------------------------- torch.func transforms


def _grad(body, inputs):
    x, y = inputs
    return torch.func.grad(lambda x: body(x, y).sum())(x)


def _vjp(body, inputs):
    return torch.func.vjp(body, *inputs)


def _jacrev(body, inputs):
    x, y = inputs
    return torch.func.jacrev(lambda x: body(x, y))(x)


def _jvp(body, inputs):
    return torch.func.jvp(body, inputs, tuple(torch.ones_like(t) for t in inputs))


def _vmap(body, inputs):
    return torch.vmap(body)(*[t.unsqueeze(0) for t in inputs])


def _grad_of_vmap(body, inputs):
    x, y = inputs
    return torch.func.grad(lambda x: torch.vmap(body)(x.unsqueeze(0), y.unsqueeze(0)).sum())(x)


def _vmap_of_grad(body, inputs):
    x, y = inputs
    inner = torch.func.grad(lambda x, y: body(x, y).sum())
    return torch.vmap(inner)(x.unsqueeze(0), y.unsqueeze(0))


def _grad_no_grad_inside(body, inputs):
    x, y = inputs

    def loss(x):
        with torch.no_grad():
            out = body(x, y)
        return (out * x).sum()

    return torch.func.grad(loss)(x)


def _grad_detached(body, inputs):
    x, y = inputs
    return torch.func.grad(lambda x: (body(x.detach(), y) * x).sum())(x)


TRANSFORMS: dict[str, Callable[[Callable, tuple], Any]] = {
    "plain": CONTEXTS["plain"],
    "grad": _grad,
    "vjp": _vjp,
    "jacrev": _jacrev,
    "jvp": _jvp,
    "vmap": _vmap,
    "grad_of_vmap": _grad_of_vmap,
    "vmap_of_grad": _vmap_of_grad,
    "grad_no_grad_inside": _grad_no_grad_inside,
    "grad_detached": _grad_detached,
    "functionalize": CONTEXTS["functionalize"],
}
TRANSFORM_INPUTS = {
    "cpu": lambda: (torch.randn(3), torch.randn(3)),
    "requires_grad": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
}
PROBE_SETS = [[], ["CPU"]]


@pytest.mark.parametrize(
    ("transform", "inputs", "backward", "keys"),
    [
        pytest.param(t, i, b, k, id=f"{t}-{i}-{'backward' if b else 'none'}-{'+'.join(k)}")
        for t, i, b, k in itertools.product(TRANSFORMS, TRANSFORM_INPUTS, (False, True), PROBE_SETS)
    ],
)
def test_custom_op_under_torch_func(
    transform: str, inputs: str, backward: bool, keys: list[str]
) -> None:
    check_against_dispatcher(
        keys,
        TRANSFORM_INPUTS[inputs](),
        TRANSFORMS[transform],
        probe=custom_op_probe(keys, backward=backward),
    )


# ---------------------------------------------------------------- autocast rules


def _complex_neg() -> torch.Tensor:
    return torch.randn(3, dtype=torch.cfloat).conj().imag


def _inference_pair() -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return torch.randn(3), torch.randn(3)


AUTOCAST_INPUTS = {
    "float32": lambda: (torch.randn(3), torch.randn(3)),
    "bfloat16": lambda: (
        torch.randn(3, dtype=torch.bfloat16),
        torch.randn(3, dtype=torch.bfloat16),
    ),
    "bfloat16_and_float32": lambda: (torch.randn(3, dtype=torch.bfloat16), torch.randn(3)),
    "float64": lambda: (torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)),
    "int64": lambda: (torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64)),
    "requires_grad": lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
    "inference": _inference_pair,
    "neg_view": lambda: (_complex_neg(), torch.randn(3)),
    "meta": lambda: (torch.randn(3, device="meta"), torch.randn(3, device="meta")),
}


def _autocast_under(*managers: Callable[[], Any]) -> Callable[[Callable, tuple], Any]:
    def run(body, inputs):
        with contextlib.ExitStack() as stack:
            for manager in managers:
                stack.enter_context(manager())
            return body(*inputs)

    return run


AUTOCAST_CONTEXTS = {
    "autocast": _autocast_under(lambda: torch.autocast("cpu")),
    "autocast_inference_mode": _autocast_under(lambda: torch.autocast("cpu"), torch.inference_mode),
    "inference_mode_autocast": _autocast_under(torch.inference_mode, lambda: torch.autocast("cpu")),
    "autocast_no_grad": _autocast_under(lambda: torch.autocast("cpu"), torch.no_grad),
    "autocast_float16_inference_mode": _autocast_under(
        lambda: torch.autocast("cpu", dtype=torch.float16), torch.inference_mode
    ),
    "autocast_dispatch_mode": _autocast_under(lambda: torch.autocast("cpu"), PassThroughMode),
    "inference_mode": _autocast_under(torch.inference_mode),
}
AUTOCAST_PROBES = [["CPU"], ["ADInplaceOrView", "CPU"], ["Negative", "ADInplaceOrView", "CPU"]]


def library_op_probe(keys: list[str], autocast: torch.dtype) -> ProbeOp:
    """A probe op (not a custom_op) with ``torch.library.register_autocast``'s rule."""
    probe = make_probe_op(keys)
    rules = torch.library.Library("opmagic_probe", "FRAGMENT")  # not a probe's site
    torch.library.register_autocast(probe.op, "cpu", autocast, lib=rules)
    probe.owners = (rules,)
    return probe


AUTOCAST_RULES = {"custom_op": custom_op_probe, "torch.library": library_op_probe}


@pytest.mark.parametrize(
    ("rule", "context", "inputs", "keys"),
    [
        pytest.param(r, c, i, k, id=f"{r}-{c}-{i}-{'+'.join(k)}")
        for r, c, i, k in itertools.product(
            AUTOCAST_RULES, AUTOCAST_CONTEXTS, AUTOCAST_INPUTS, AUTOCAST_PROBES
        )
    ],
)
def test_autocast_rules_cast_into_fresh_tensors(
    rule: str, context: str, inputs: str, keys: list[str]
) -> None:
    check_against_dispatcher(
        keys,
        AUTOCAST_INPUTS[inputs](),
        AUTOCAST_CONTEXTS[context],
        probe=AUTOCAST_RULES[rule](keys, autocast=torch.bfloat16),
    )
