"""The eager rungs: registrations, schema vs behaviour, the fake impl (signature, then against
the kernel), autograd and gradients, vmap, and on a GPU a side stream and CUDA-graph capture.

Each rung is a function of the :class:`~.ladder.Ladder`; it returns when it passes, reports
findings through the ladder, and ends with :class:`~.ladder.RungFailed` or
:class:`~.ladder.RungSkipped`.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError

from ..._torch import compilers
from ...dispatch.keys import catalogue
from ..values import describe_value, first_line
from . import fixes
from .causes import classify
from .ladder import Ladder, Run, RungFailed, RungSkipped, first_lines, tensors_of
from .samples import Sample
from .target import is_float_tensor

# alias keys of kernels that a CompositeImplicitAutograd kernel hides from FakeTensor, compile
# and export (besides backend kernels: CPU, CUDA, Meta, ...)
_COMPUTING_ALIASES = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def registrations(ladder: Ladder) -> None:
    """A CompositeImplicitAutograd kernel beside other kernels of the op: FakeTensor,
    torch.compile and export decompose the op through it, so the others never run there."""
    target = ladder.target
    active = [r for r in target.table.registrations if r.active and not r.fallthrough]
    composite = next((r for r in active if r.key == "CompositeImplicitAutograd"), None)
    if composite is None:
        return
    hidden = [r for r in active if _computes(r.key)]
    if not hidden:
        return
    keys = ", ".join(r.key for r in hidden)
    ladder.report(
        "composite-shadows",
        f"{target.name} has a CompositeImplicitAutograd kernel and kernels for {keys}: "
        "FakeTensor, torch.compile and torch.export decompose the op through the "
        f"CompositeImplicitAutograd kernel, so the {keys} kernel(s) never run there.",
        "; ".join(f"{r.key}: {r.source}" for r in [composite, *hidden]),
        composite.source,
        f'lib.impl("{target.name.partition("::")[2].partition(".")[0]}", kernel, '
        '"CompositeExplicitAutograd")  # instead of CompositeImplicitAutograd; or remove the '
        f"{keys} registration(s)",
    )
    raise RungFailed(f"CompositeImplicitAutograd hides {keys}")


def _computes(key: str) -> bool:
    """Whether a kernel registered for ``key`` computes the op for a backend (not tracing,
    batching, autocast or autograd bookkeeping; nested tensors have a composite of their own)."""
    if key in _COMPUTING_ALIASES:
        return True
    info = catalogue().by_name.get(key)
    return info is not None and info.category == "backend" and info.functionality != "NestedTensor"


def schema(ladder: Ladder) -> None:
    """Run the kernel on every sample (its results are the reference of every later rung) and
    compare what it did with what the schema declares: mutated arguments, outputs that alias
    inputs. A sample the kernel raises on is the user's error (DoctorSampleError)."""
    target = ladder.target
    declared = target.mutable_arguments
    mutated_anywhere: set[str] = set()
    for index, sample in enumerate(ladder.samples):
        before = sample.fresh()
        fresh = sample.fresh()
        try:
            with torch.no_grad():
                output = ladder.call(fresh)
        except Exception as error:
            if classify(error) == "output-aliases-input":
                site, fix = ladder.clone_fix()
                ladder.report(
                    "output-aliases-input",
                    f"{target.name} returns one of its inputs, or a view of one, which an "
                    "operator may not: torch.compile and autograd assume a new tensor.",
                    first_lines(error, 1),
                    site,
                    fix,
                )
                raise RungFailed("an output aliases an input") from None
            raise ladder.sample_error(index, error) from error
        ladder.runs.append(Run(before, output, fresh))
        mutated = _mutated(target.argument_names, before, fresh)
        mutated_anywhere |= mutated
        undeclared = sorted(mutated - declared)
        if undeclared:
            ladder.report(
                "mutation-undeclared",
                f"{target.name} writes to {', '.join(undeclared)}, which its schema does not "
                "declare as mutated: torch.compile may reorder or drop the write.",
                f"schema {target.schema}; after the call on {sample.described}, "
                f"{', '.join(undeclared)} changed",
                target.definition_site(),
                fixes.declare_mutations(target, sorted(declared | mutated)),
            )
        aliased = _aliased_inputs(target, fresh, output)
        if aliased:
            site, fix = ladder.clone_fix()
            ladder.report(
                "output-aliases-input",
                f"{target.name} returns {', '.join(aliased)} (or a view of it) as an output on "
                f"{sample.described}: an operator returns new tensors, or torch.compile and "
                "autograd go wrong.",
                f"output storage is {', '.join(aliased)}'s storage",
                site,
                fix,
            )
    overdeclared = sorted(declared - mutated_anywhere)
    if overdeclared:
        ladder.report(
            "mutation-overdeclared",
            f"the schema says {target.name} mutates {', '.join(overdeclared)}, but no sample "
            "changed it: torch.compile then copies it back for nothing.",
            f"schema {target.schema}; {', '.join(overdeclared)} unchanged on every sample",
            target.definition_site(),
            fixes.declare_mutations(target, sorted(declared & mutated_anywhere)),
        )
    if ladder.causes_here:
        raise RungFailed(", ".join(dict.fromkeys(ladder.causes_here)))


def _mutated(names: list[str], before: Sample, after: Sample) -> set[str]:
    """Argument names whose tensors differ after the call (values, sizes or strides)."""
    changed = set()
    positional = list(zip(names, before.args, after.args, strict=False))
    keyword = [(n, before.kwargs[n], after.kwargs[n]) for n in after.kwargs if n in before.kwargs]
    for name, old, new in positional + keyword:
        for a, b in zip(tensors_of(old), tensors_of(new), strict=False):
            if a.shape != b.shape or not _same_values(a, b):
                changed.add(name)
    return changed


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaNs equal to NaNs."""
    if a.is_sparse or b.is_sparse:
        a, b = a.to_dense(), b.to_dense()
    a, b = a.detach(), b.detach()
    if a.is_floating_point() or a.is_complex():
        return bool(
            torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        )
    return torch.equal(a, b)


def _aliased_inputs(target: Any, sample: Sample, output: Any) -> list[str]:
    """Arguments whose storage an output shares, unless the schema declares that alias."""
    declared = {
        a.name
        for a in target.schema.arguments
        if a.alias_info is not None and any(r.alias_info is not None for r in target.schema.returns)
    }
    storages = {}
    for name, value in list(zip(target.argument_names, sample.args, strict=False)) + list(
        sample.kwargs.items()
    ):
        for tensor in tensors_of(value):
            if not tensor.is_sparse and tensor.untyped_storage().nbytes():
                storages[tensor.untyped_storage().data_ptr()] = name
    aliased = []
    for out in tensors_of(output):
        if out.is_sparse or not out.untyped_storage().nbytes():
            continue
        name = storages.get(out.untyped_storage().data_ptr())
        if name is not None and name not in declared and name not in aliased:
            aliased.append(name)
    return aliased


def fake_signature(ladder: Ladder) -> None:
    """The Python fake impl takes the op's arguments as the op passes them."""
    target = ladder.target
    fake = target.fake_function()
    if fake is None:
        raise RungSkipped("no Python fake impl (a C++ Meta kernel, or none)")
    try:
        signature = inspect.signature(fake)
    except (TypeError, ValueError):
        raise RungSkipped("the fake impl's signature cannot be read") from None
    positional = [a.name for a in target.schema.arguments if not a.kwarg_only]
    keyword = {a.name: a.name for a in target.schema.arguments if a.kwarg_only}
    try:
        signature.bind(*positional, **keyword)
    except TypeError as error:
        ladder.report(
            "fake-signature",
            f"the fake impl of {target.name} cannot take the op's arguments: {error}.",
            f"fake impl {getattr(fake, '__name__', 'fake')}{signature} vs schema "
            f"({', '.join(str(a) for a in target.schema.arguments)})",
            target.fake_site(),
            fixes.fake_signature(target),
        )
        raise RungFailed(str(error)) from None


def fake(ladder: Ladder) -> None:
    """The fake impl against the kernel, per sample: the outputs' count, shape, dtype, device,
    strides and storage offset; a size that changes between same-shape inputs is data-dependent."""
    target = ladder.target
    mismatches: list[tuple[str, str]] = []  # (kind, evidence)
    dynamic = 0
    for run in ladder.runs:
        mode = compilers.fake_mode()
        fake_sample = run.sample.fresh().mapped(lambda t, m=mode: compilers.fake_tensor(m, t))
        with mode:
            try:
                fake_output = ladder.call(fake_sample)
            except compilers.dynamic_output_shape_error():
                dynamic += 1  # the fake asks for a data-dependent size: make_fx checks it
                continue
            except Exception as error:
                cause = classify(error) or "fake-raises"
                ladder.report_cause(
                    cause,
                    _fake_message(target.name, cause, error),
                    _fake_evidence(ladder, cause, error),
                )
                raise RungFailed(f"{cause} on {run.sample.described}") from None
        mismatch = _compare_outputs(run.output, fake_output)
        if mismatch is not None:
            kind, evidence = mismatch
            if kind == "fake-shape" and _data_dependent(ladder, run):
                kind = "data-dependent-shape"
            mismatches.append((kind, f"on {run.sample.described}: {evidence}"))
    if not mismatches:
        if dynamic == len(ladder.runs):
            raise RungSkipped("the fake impl's output size depends on the data (make_fx checks it)")
        return
    kind, evidence = mismatches[0]
    message = {
        "data-dependent-shape": f"the output size of {target.name} depends on the input's "
        "values (same-shape inputs give outputs of other sizes), but the fake impl returns "
        "one size: it must ask for a data-dependent size with ctx.new_dynamic_size().",
    }.get(
        kind,
        f"the fake impl of {target.name} describes the output differently from the kernel "
        f"({kind.removeprefix('fake-')}): torch.compile plans memory from the fake, so "
        "compiled code reads or writes the wrong elements.",
    )
    samples = [run.sample for run in ladder.runs]
    outputs = [run.output for run in ladder.runs]
    ladder.report(
        kind,
        message,
        "; ".join(e for _, e in mismatches[:3]),
        target.fake_site(),
        fixes.fake_impl(target, samples, outputs),
    )
    raise RungFailed(kind)


def _fake_message(name: str, cause: str, error: BaseException) -> str:
    """What a fake run that raised means."""
    if cause == "no-fake":
        return (
            f"{name} has no fake impl, so FakeTensor, torch.compile, torch.export and "
            "make_fx cannot trace it."
        )
    if cause == "data-dependent-shape":
        return (
            f"the fake impl of {name} reads the data ({type(error).__name__}): an output size "
            "that depends on the values must come from ctx.new_dynamic_size()."
        )
    return f"the fake impl of {name} raised {first_line(error)} on inputs the kernel takes."


def _fake_evidence(ladder: Ladder, cause: str, error: BaseException) -> str:
    """The table row (no fake impl) or the exception (anything else)."""
    if cause == "no-fake":
        return ladder.target.describe_entry("Meta")
    return first_lines(error)


def _compare_outputs(real: Any, fake: Any) -> tuple[str, str] | None:
    """The first way a fake output differs from the real one: ``(cause, evidence)``."""
    reals, fakes = tensors_of(real), tensors_of(fake)
    if len(reals) != len(fakes):
        return "fake-shape", f"the kernel returns {len(reals)} tensor(s), the fake {len(fakes)}"
    for index, (r, f) in enumerate(zip(reals, fakes, strict=True)):
        where = "output" if len(reals) == 1 else f"output {index}"
        if r.shape != f.shape:
            return "fake-shape", f"{where}: kernel {list(r.shape)}, fake {list(f.shape)}"
        if r.dtype != f.dtype:
            return "fake-dtype", f"{where}: kernel {r.dtype}, fake {f.dtype}"
        if r.device != f.device:
            return "fake-device", f"{where}: kernel {r.device}, fake {f.device}"
        if r.layout == torch.strided and not _same_strides(r, f):
            return (
                "fake-strides",
                f"{where} {describe_value(r)}: kernel strides {r.stride()} offset "
                f"{r.storage_offset()}, fake strides {f.stride()} offset {f.storage_offset()}",
            )
    return None


def _same_strides(real: torch.Tensor, fake: torch.Tensor) -> bool:
    """Strides equal in every dim of size above 1 (others do not matter), offsets equal."""
    if real.storage_offset() != fake.storage_offset():
        return False
    return all(
        size <= 1 or a == b
        for size, a, b in zip(real.shape, real.stride(), fake.stride(), strict=True)
    )


def _data_dependent(ladder: Ladder, run: Run) -> bool:
    """Whether a same-shape sample with other values gives outputs of other sizes."""
    for _ in range(3):
        try:
            with torch.no_grad():
                other = ladder.call(run.sample.variant())
        except Exception:  # the kernel refuses other values: no evidence either way
            return False
        if [t.shape for t in tensors_of(other)] != [t.shape for t in tensors_of(run.output)]:
            return True
    return False


def autograd(ladder: Ladder) -> None:
    """With inputs that require grad: the outputs require grad, and backward runs (an
    autograd formula is registered, returning one gradient per input)."""
    target = ladder.target
    graded = [s for s in ladder.samples if any(t.requires_grad for t in s.tensors())]
    if not graded:
        raise RungSkipped("no sample has a tensor that requires grad")
    ran = 0
    for sample in graded:
        fresh = sample.fresh()
        inputs = [t for t in fresh.tensors() if t.requires_grad]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                output = ladder.call(fresh)
                outs = [t for t in tensors_of(output) if is_float_tensor(t)]
                if not outs:
                    continue
                ran += 1
                if not any(t.requires_grad for t in outs):
                    ladder.report_cause(
                        "no-autograd",
                        f"{target.name}'s outputs do not require grad although its inputs do: "
                        "it has no autograd formula, so gradients stop at it.",
                        target.describe_entry("AutogradCPU"),
                    )
                    raise RungFailed("no-autograd")
                needing = [t for t in outs if t.requires_grad]
                torch.autograd.grad(
                    needing,
                    inputs,
                    [torch.ones_like(t) for t in needing],
                    allow_unused=True,
                )
            except RungFailed:
                raise
            except Exception as error:
                cause = classify(error) or "backward-wrong"
                ladder.report_cause(
                    cause, _autograd_message(target, cause, error), first_lines(error)
                )
                raise RungFailed(f"{cause} on {sample.described}") from None
        for warning in caught:
            if classify(Exception(str(warning.message))) == "no-autograd":
                ladder.report_cause(
                    "no-autograd",
                    f"{target.name} has no autograd formula: backward through it warns and "
                    "gives no gradient to its inputs.",
                    f"{target.describe_entry('AutogradCPU')}; {str(warning.message)[:120]}",
                )
                raise RungFailed("no-autograd")
    if not ran:
        raise RungSkipped("the op returns no floating-point tensor: nothing to differentiate")


def _autograd_message(target: Any, cause: str, error: BaseException) -> str:
    """What a backward that raised means."""
    if cause == "no-autograd":
        return (
            f"{target.name} has no autograd formula: backward through it raises. Register one "
            "(register_autograd), or pass inputs that do not require grad."
        )
    if cause == "backward-arity":
        count = len(target.argument_names)
        return (
            f"the backward of {target.name} must return {count} gradient(s), one per input "
            f"({', '.join(target.argument_names)}), None for inputs without one: "
            f"{first_line(error)}"
        )
    return f"the backward of {target.name} raised {first_line(error)}"


def gradients(ladder: Ladder) -> None:
    """``torch.autograd.gradcheck`` (fast mode: the Jacobian against a random projection)
    against numerical gradients, in float64 where the kernel takes it (else float32 with
    looser tolerances)."""
    target = ladder.target
    graded = [s for s in ladder.samples if any(t.requires_grad for t in s.tensors())]
    if not graded:
        raise RungSkipped("no sample has a tensor that requires grad")
    for sample in graded:
        checked = _gradcheck(ladder, sample)
        if checked is not None:
            ladder.report(
                "backward-wrong",
                f"the backward of {target.name} gives gradients that differ from the numerical "
                f"ones on {sample.described}{checked[1]}.",
                checked[0],
                target.backward_site(),
                "",
            )
            raise RungFailed("backward-wrong")


def _gradcheck(ladder: Ladder, sample: Sample) -> tuple[str, str] | None:
    """gradcheck on the tensors that require grad: ``(evidence, note)`` when it fails."""
    for dtype, options, note in (
        (torch.float64, {}, ""),
        (
            torch.float32,
            {"eps": 1e-3, "atol": 1e-2, "rtol": 1e-2},
            " (in float32: the kernel refuses float64)",
        ),
    ):
        cast = sample.fresh().mapped(lambda t, d=dtype: _as_leaf(t, d))
        leaves = [t for t in cast.tensors() if t.requires_grad]
        try:
            with torch.no_grad():
                ladder.call(cast.fresh())
        except Exception:
            continue  # the kernel refuses this dtype: try the next
        try:
            torch.autograd.gradcheck(
                lambda *xs, cast=cast: tuple(
                    t
                    for t in tensors_of(ladder.call(_replace_leaves(cast, xs)))
                    if is_float_tensor(t)
                ),
                tuple(leaves),
                fast_mode=True,  # a random projection of the Jacobian: one column, not each
                **options,
            )
        except GradcheckError as error:
            lines = [line for line in str(error).splitlines() if line.strip()][:8]
            return "\n".join(lines), note
        except Exception as error:
            cause = classify(error)
            if cause is None:
                raise RungSkipped(f"gradcheck could not run: {first_line(error)}") from None
            ladder.report_cause(
                cause, _autograd_message(ladder.target, cause, error), first_lines(error)
            )
            raise RungFailed(cause) from None
        return None
    raise RungSkipped("the kernel takes neither float64 nor float32 inputs")


def _as_leaf(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A floating tensor that requires grad as a ``dtype`` leaf; others unchanged."""
    if tensor.requires_grad and tensor.is_floating_point():
        return tensor.detach().to(dtype).requires_grad_(True)
    return tensor.detach()


def _replace_leaves(sample: Sample, leaves: tuple) -> Sample:
    """The sample with its grad-requiring tensors replaced, in order, by ``leaves``."""
    remaining = iter(leaves)
    return sample.mapped(lambda t: next(remaining) if t.requires_grad else t)


def vmap(ladder: Ladder) -> None:
    """Where the op registers a batching rule: ``torch.vmap`` over a batch of two samples
    against the op run on each."""
    target = ladder.target
    if not target.has_own_vmap():
        raise RungSkipped("the op registers no vmap rule (vmap runs it sample by sample)")
    for run in ladder.runs:
        tensors = run.sample.tensors()
        if not tensors:
            raise RungSkipped("the samples have no tensor to batch")
        second = run.sample.variant()
        batched = _stack(run.sample, second)
        try:
            with torch.no_grad():
                expected = [run.output, ladder.call(second.fresh())]
                got = torch.vmap(lambda *a, **k: target.overload(*a, **k))(
                    *batched.args, **batched.kwargs
                )
        except Exception as error:
            ladder.explain(error, "vmap", "vmap-wrong")
        for index in range(2):
            for g, e in zip(tensors_of(got), tensors_of(expected[index]), strict=False):
                try:
                    torch.testing.assert_close(g[index], e, equal_nan=True)
                except AssertionError as error:
                    ladder.report(
                        "vmap-wrong",
                        f"the vmap rule of {target.name} gives other values than the op run on "
                        "each sample.",
                        first_lines(error, 4),
                        _vmap_site(ladder),
                        "",
                    )
                    raise RungFailed("vmap-wrong") from None


def _vmap_site(ladder: Ladder) -> str:
    """Where the vmap rule was written."""
    from .target import function_site

    rule = ladder.target.vmap_function()
    return function_site(rule) if rule is not None else ladder.target.definition_site()


def _stack(first: Sample, second: Sample) -> Sample:
    """Two same-shape samples stacked along a new dim 0 (non-tensors from the first)."""
    seconds = iter(second.tensors())
    return first.fresh().mapped(lambda t: torch.stack([t.detach(), next(seconds).detach()]))


def cuda_stream(ladder: Ladder) -> None:
    """On a side stream: the op's results equal those of the default stream."""
    samples = _cuda_samples(ladder)
    for sample, expected in samples:
        stream = torch.cuda.Stream()
        fresh = sample.fresh()
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream), torch.no_grad():
                got = ladder.call(fresh)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
        except Exception as error:
            ladder.explain(error, "on a side stream", "stream-unsafe")
        _expect_same(ladder, got, expected, "stream-unsafe", "on a side stream")


def cuda_graph(ladder: Ladder) -> None:
    """Captured in a CUDA graph and replayed: the results equal eager ones."""
    samples = _cuda_samples(ladder)
    for sample, expected in samples:
        static = sample.fresh()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                ladder.call(static.fresh())  # warm up outside the capture, as torch advises
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                output = ladder.call(static)
            graph.replay()
            torch.cuda.synchronize()
        except Exception as error:
            ladder.report(
                "graph-unsafe",
                f"{ladder.target.name} cannot be captured in a CUDA graph: {first_line(error)} "
                "(a host sync, an allocation outside torch's allocator, or a CPU read of GPU "
                "data inside the kernel's launcher).",
                first_lines(error),
                ladder.target.kernel_site(),
                "",
            )
            raise RungFailed("graph-unsafe") from None
        _expect_same(ladder, output, expected, "graph-unsafe", "replayed from a CUDA graph")


def _cuda_samples(ladder: Ladder) -> list[tuple[Sample, Any]]:
    """The samples on CUDA with their eager outputs; a skip without a GPU or CUDA samples."""
    if not torch.cuda.is_available():
        raise RungSkipped("no GPU here")
    found = []
    for run in ladder.runs:
        if any(t.is_cuda for t in run.sample.tensors()):
            found.append((run.sample, run.output))
    if not found:
        raise RungSkipped("no sample is on a CUDA device")
    return found


def _expect_same(ladder: Ladder, got: Any, expected: Any, cause: str, how: str) -> None:
    """Report ``cause`` when ``got`` differs from ``expected``."""
    for g, e in zip(tensors_of(got), tensors_of(expected), strict=False):
        try:
            torch.testing.assert_close(g, e, equal_nan=True)
        except AssertionError as error:
            ladder.report(
                cause,
                f"{ladder.target.name} gives other values {how} than in eager.",
                first_lines(error, 4),
                ladder.target.kernel_site(),
                "launch the kernel on torch.cuda.current_stream() (C++: "
                "at::cuda::getCurrentCUDAStream())"
                if cause == "stream-unsafe"
                else "",
            )
            raise RungFailed(cause) from None
