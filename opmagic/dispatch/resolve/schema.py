"""What an operator's schema says that kernels decide by: mutation, aliasing, returns.

Fallbacks read the schema, not the arguments, to decide whether they can serve an op at
all (vmap's per-sample loop, functionalization, the math-bit and ZeroTensor fallbacks);
these are the same tests they make, on the ``FunctionSchema`` torch holds.
"""

from __future__ import annotations

from typing import Any


def writes(argument: Any) -> bool:
    """Whether a schema argument (or return) is written to: ``Tensor(a!)``."""
    return argument.alias_info is not None and argument.alias_info.is_write


def has_alias_info(schema: Any) -> bool:
    """``FunctionSchema::hasAnyAliasInfo``: any argument or return carries ``(a)``/``(a!)``."""
    return any(a.alias_info is not None for a in [*schema.arguments, *schema.returns])


def mixes_writes_and_views(schema: Any) -> bool:
    """Whether the aliased arguments are some written (``a!``) and some only viewed (``a``)."""
    kinds = {writes(a) for a in schema.arguments if a.alias_info is not None}
    return len(kinds) == 2


def is_view(schema: Any) -> bool:
    """Whether the aliased arguments are views only (none is written to)."""
    aliased = [a for a in schema.arguments if a.alias_info is not None]
    return bool(aliased) and not any(writes(a) for a in aliased)


def is_inplace(schema: Any) -> bool:
    """functorch's ``isInplaceOp``: mutable, self written and returned, nothing else aliased."""
    arguments, returns = list(schema.arguments), list(schema.returns)
    if not schema.is_mutable or len(returns) != 1 or not arguments:
        return False
    if not writes(arguments[0]) or any(a.alias_info is not None for a in arguments[1:]):
        return False
    return writes(returns[0])


def returns_only_tensors(schema: Any) -> bool:
    """Whether every return is a plain ``Tensor`` (no ``Tensor?``, list, int; ``-> ()`` is)."""
    return all(str(r.type) == "Tensor" for r in schema.returns)


def takes_tensor_list(schema: Any) -> bool:
    """Whether an argument is a ``Tensor[]`` or ``Tensor?[]``."""
    return any(str(a.type) in ("List[Tensor]", "List[Optional[Tensor]]") for a in schema.arguments)


def returns_first(schema: Any, name: str) -> bool:
    """Whether the op's first return is argument ``name`` itself (the same alias set)."""
    returns = list(schema.returns)
    argument = next((a for a in schema.arguments if a.name == name), None)
    if not returns or argument is None or argument.alias_info is None:
        return False
    alias = returns[0].alias_info
    return alias is not None and alias.before_set == argument.alias_info.before_set
