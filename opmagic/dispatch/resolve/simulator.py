"""The walk: one call through the dispatcher model, a :class:`Step` per kernel it reaches.

Each dispatch computes its keyset from the arguments and the thread-local state
(:meth:`Simulator._dispatch`), the highest key picks a table entry, the key's handler says
what its kernel does next (:func:`~.handlers.kernel_outcome`), and the simulator applies
that to the state: a redispatch continues with the keyset the kernel passes on, a call
starts a fresh dispatch under the guards the kernel set up, anything else ends the walk.
"""

from __future__ import annotations

import dataclasses

from ..._torch import custom_op_state, dispatcher, library_hooks
from .. import keys
from ..keys import KeyCatalogue
from ..ops import OpRef
from ..table import OperatorTable
from .binding import BoundArgument, dispatch_values, numbers_become_tensors
from .call import DispatchState, KernelOutcome, OperatorCall
from .handlers import kernel_outcome
from .messages import describe_tensor
from .origins import KeyOrigin, context_words, exclusion_reason, key_origins
from .result import DispatchInput, Resolution, Skip, Step

MAX_STEPS = 64
"""A path longer than this is taken for a kernel loop and ends with an error."""


class Simulator:
    """Walks one call through the dispatcher model, recording a Step per kernel."""

    def __init__(self, ref: OpRef, table: OperatorTable, arguments: list[BoundArgument]) -> None:
        state = DispatchState(
            values=dispatch_values(arguments, numbers_become_tensors(ref)),
            included=dispatcher.tls_included_raw(),
            excluded=dispatcher.tls_excluded_raw(),
            modes=dispatcher.dispatch_modes(),
            layers=dispatcher.functorch_layers(),
        )
        opdef = custom_op_state.custom_op_def(ref.qualname)
        self.call = OperatorCall(
            ref=ref,
            table=table,
            arguments=arguments,
            catalogue=keys.catalogue(),
            state=state,
            custom_op=custom_op_state.custom_op_parts(opdef) if opdef is not None else None,
            custom_op_sites=library_hooks.custom_op_sites(opdef) if opdef is not None else set(),
        )
        self.initial = dataclasses.replace(state, saved_tls=[], excluded_by=[])  # as called
        self.steps: list[Step] = []

    def run(self) -> Resolution:
        """Walk the call from its first dispatch until a kernel ends it, fails or hands over
        to Python (or :data:`MAX_STEPS` kernels ran), and describe the path.

        Keys the dispatcher passed over (excluded, fallthrough, masked by a redispatch, above
        a key whose kernel the caller runs directly) are recorded on the step of the next key
        that runs below them. A kernel that fails only once the path below it returned (a
        math-bit fallback copying a result back) makes the error of a path that otherwise
        ends well.
        """
        catalogue, state = self.call.catalogue, self.call.state
        keyset, pending, origin_of = self._dispatch(via="dispatch")
        via = "dispatch"
        error: str | None = None
        start_at: str | None = None  # a key whose kernel the caller runs directly
        raised_on_return: list[str] = []  # kernels that raise once the path below returns
        while True:
            if len(self.steps) == MAX_STEPS:
                error = f"the path did not end within {MAX_STEPS} kernels (a kernel loop?)"
                break
            key = start_at or catalogue.highest(keyset) or "Undefined"
            if start_at is not None:
                pending += [
                    Skip(k, "masked", f"the caller runs the {start_at} kernel directly")
                    for k in catalogue.names(keyset)
                    if _has_priority_over(catalogue, k, start_at)
                ]
                start_at = None
            entry = self.call.table.entry(key)
            skipped = tuple(s for s in pending if _has_priority_over(catalogue, s.key, key))
            pending = [s for s in pending if s not in skipped]
            outcome = kernel_outcome(self.call, key, entry, keyset)
            previous = self.steps[-1].key if self.steps else None
            self.steps.append(
                Step(
                    key,
                    entry,
                    via,
                    origin_of(key, previous),
                    skipped,
                    outcome.action,
                    outcome.note,
                    state.assumed,
                )
            )
            if outcome.fails_after is not None:
                raised_on_return.append(outcome.fails_after)
            if outcome.action == "error":
                error = outcome.note
                break
            if outcome.action in ("ends", "python"):
                break
            if outcome.values is not None:
                state.values = outcome.values
            if outcome.action == "redispatch":
                assert outcome.keyset is not None
                self._exclude(outcome.exclude, key)
                pending += [
                    Skip(k, "masked", f"{key}'s kernel redispatches past it")
                    for k in catalogue.names(outcome.masked)
                ]
                keyset, via = outcome.keyset, "redispatch"
                continue
            self._enter_call(outcome, key)
            keyset, pending, origin_of = self._dispatch(via="call", caller=key)
            start_at = outcome.start_at
            via = "call"
        if error is None and raised_on_return:  # the innermost kernel raises first
            error = raised_on_return[-1]
        return self._resolution(error)

    def refused(self, reason: str) -> Resolution:
        """The resolution of a call torch refuses before dispatch (an argument's type): no
        kernel runs, and ``reason`` is the error."""
        return self._resolution(reason)

    def _resolution(self, error: str | None) -> Resolution:
        """The steps walked so far, the error, and the call's inputs and context in words."""
        catalogue = self.call.catalogue
        return Resolution(
            op=str(self.call.ref),
            schema=self.call.table.schema,
            steps=tuple(self.steps),
            error=error,
            inputs=tuple(
                DispatchInput(
                    value.name, describe_tensor(value.tensor), tuple(catalogue.names(value.keyset))
                )
                for value in self.initial.values
            ),
            context=tuple(context_words(catalogue, self.initial)),
            tls_included=tuple(catalogue.names(self.initial.included)),
            tls_excluded=tuple(catalogue.names(self.initial.excluded)),
            table=self.call.table.table(),
        )

    def _exclude(self, bits: int, by: str) -> None:
        """Add keys to the TLS exclude set, remembering whose guard did it."""
        state = self.call.state
        added = bits & ~state.excluded
        if added:
            state.excluded_by.append((added, by))
        state.excluded |= bits

    def _enter_call(self, outcome: KernelOutcome, caller: str) -> None:
        """Apply what a kernel sets up before calling the op again."""
        state = self.call.state
        if outcome.tls is not None:
            state.included, state.excluded = outcome.tls
            state.excluded_by.append((state.excluded & ~self.initial.excluded, caller))
        state.included = (state.included | outcome.include) & ~outcome.uninclude
        self._exclude(outcome.exclude, caller)
        if outcome.pop_mode:
            state.modes = state.modes[:-1]
        if outcome.pop_layer:
            state.layers = state.layers[:-1]
        state.assumed = state.assumed or outcome.assumed

    def _dispatch(self, via: str, caller: str | None = None) -> tuple[int, list[Skip], KeyOrigin]:
        """The keyset of a fresh dispatch, the keys it passes over, and where each key came from.

        ``((keys of the tensor arguments | TLS include) - TLS exclude)`` masked by the op's
        fallthrough keys, as ``DispatchKeyExtractor`` computes it.
        """
        catalogue, state = self.call.catalogue, self.call.state
        argument_keys = 0
        for value in state.values:
            argument_keys |= value.keyset
        candidates = argument_keys | state.included
        after_tls = catalogue.minus(candidates, state.excluded)
        keyset = catalogue.minus(after_tls, self.call.table.fallthrough_mask(after_tls))
        kept = set(catalogue.names(keyset))
        skipped = []
        for name in catalogue.names(candidates):
            if name in kept:
                continue
            if after_tls & catalogue.functionality_raw(name):
                skipped.append(Skip(name, "fallthrough", "fallthrough for this op"))
            else:
                skipped.append(Skip(name, "excluded", exclusion_reason(catalogue, name, state)))
        return keyset, skipped, key_origins(catalogue, state, via, caller)


def _has_priority_over(catalogue: KeyCatalogue, skipped: str, key: str) -> bool:
    """Whether ``skipped`` has a higher priority than ``key`` (so it was passed first)."""
    if key == "Undefined":
        return True
    return catalogue.by_name[skipped].priority < catalogue.by_name[key].priority
