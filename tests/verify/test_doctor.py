"""The doctor against real broken ops: each cause built from a small op, checked for its code,
its site (the line that registered the part at fault) and, where the fix is mechanical, that
applying ``.fix`` makes the ladder pass. Healthy ops (torch's custom_op_db with its OpInfo
samples) get no finding, and the doctor leaves the dispatcher, dynamo and configs as they were.

Fast tests climb the eager rungs and make_fx (``until="make_fx"``: no compile); tests that
compile are marked slow and use few ops.
"""

from __future__ import annotations

import itertools
import textwrap

import pytest
import torch
from torch import Tensor

from opmagic import DoctorSampleError, doctor
from opmagic.errors import ArgumentTypeError
from opmagic.verify.doctor import CAUSES, RUNG_NAMES
from opmagic.verify.doctor.causes import classify

from ..shell import DispatcherState, warm_up_torch

EAGER = "make_fx"  # the last rung the fast tests climb: nothing compiles up to it
_namespaces = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    warm_up_torch()


@pytest.fixture
def ns() -> str:
    """A fresh operator namespace per test."""
    return f"doc{next(_namespaces)}"


def define(source: str, ns: str) -> dict:
    """Run ``source`` (custom ops of namespace ``NS``) as a module of its own; its names."""
    namespace = {"torch": torch, "Tensor": Tensor}
    code = textwrap.dedent(source).replace("NS", ns)
    filename = f"<doctor-test-{ns}>"
    import linecache

    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    exec(compile(code, filename, "exec"), namespace)
    return namespace


def line_of(namespace: dict, text: str, ns: str) -> str:
    """``<doctor-test-ns>:N`` for the first line of the test's source containing ``text``."""
    import linecache

    filename = f"<doctor-test-{ns}>"
    for number, line in enumerate(linecache.cache[filename][2], 1):
        if text in line:
            return f"{filename}:{number}"
    raise AssertionError(f"{text!r} not in the source")


def apply(namespace: dict, fix: str) -> None:
    """Run a finding's fix (a snippet registering something) where the op was defined."""
    exec(compile(fix, "<fix>", "exec"), namespace)


TWICE = """
@torch.library.custom_op("NS::twice", mutates_args=())
def twice(x: Tensor) -> Tensor:
    return x * 2
"""


def test_no_fake_is_found_at_the_fake_rung_once_and_its_fix_makes_the_ladder_pass(ns) -> None:
    names = define(TWICE, ns)
    found = doctor(names["twice"], torch.randn(3), until=EAGER, progress=False)
    assert found.causes == {"no-fake"}
    (finding,) = found.findings
    assert finding.rung == "fake"
    assert finding.site == line_of(names, "@torch.library.custom_op", ns)
    assert "Meta: stub" in finding.evidence
    assert found.rung("opcheck").status == "fail" and found.rung("opcheck").causes == ("no-fake",)
    assert found.rung("make_fx").status == "skip" and "no-fake" in found.rung("make_fx").detail
    apply(names, finding.fix)
    assert doctor(names["twice"], torch.randn(3), until=EAGER, progress=False).ok


@pytest.mark.parametrize(
    ("fake_body", "cause"),
    [
        ("return x.new_empty(x.shape[0] + 1)", "fake-shape"),
        ("return torch.empty_like(x, dtype=torch.float64)", "fake-dtype"),
        ("return torch.empty(x.shape, device='meta')", "fake-device"),
        ("return torch.empty_like(x)", "fake-strides"),
    ],
)
def test_a_wrong_fake_is_named_at_its_line_and_the_inferred_fake_fixes_it(
    ns, fake_body: str, cause: str
) -> None:
    names = define(
        f"""
        @torch.library.custom_op("NS::f", mutates_args=())
        def f(x: Tensor) -> Tensor:
            return (x * 2).t().contiguous().t()  # column-major output

        @f.register_fake
        def _(x):
            {fake_body}
        """,
        ns,
    )
    samples = [(torch.randn(3, 4),), (torch.randn(5, 2),)]
    found = doctor(names["f"], samples=samples, until=EAGER, progress=False)
    assert found.causes == {cause}
    (finding,) = found.findings
    assert finding.rung == "fake"
    assert finding.site == line_of(names, "@f.register_fake", ns)
    apply(names, finding.fix)
    assert doctor(names["f"], samples=samples, until=EAGER, progress=False).ok


def test_a_fake_that_does_not_take_the_ops_arguments_is_fake_signature(ns, fake_tensor_log) -> None:
    names = define(
        """
        @torch.library.custom_op("NS::mul", mutates_args=())
        def mul(x: Tensor, y: Tensor) -> Tensor:
            return x * y

        @mul.register_fake
        def _(x):
            return torch.empty_like(x)
        """,
        ns,
    )
    found = doctor(names["mul"], torch.randn(3), torch.randn(3), until=EAGER, progress=False)
    assert found.causes == {"fake-signature"}
    assert found.findings[0].site == line_of(names, "@mul.register_fake", ns)
    assert found.findings[0].fix.endswith("def _(x, y):")
    assert found.rung("fake").status == "skip"
    assert fake_tensor_log == []  # not FakeTensorMode's log of the TypeError too


def test_an_output_size_that_depends_on_the_data_is_data_dependent_shape(ns) -> None:
    names = define(
        """
        @torch.library.custom_op("NS::positive", mutates_args=())
        def positive(x: Tensor) -> Tensor:
            return x[x > 0].clone()

        @positive.register_fake
        def _(x):
            return torch.empty_like(x)
        """,
        ns,
    )
    found = doctor(names["positive"], torch.randn(16), until=EAGER, progress=False)
    assert found.causes == {"data-dependent-shape"}
    (finding,) = found.findings
    assert "new_dynamic_size()" in finding.fix
    apply(names, finding.fix)
    fixed = doctor(names["positive"], torch.randn(16), until=EAGER, progress=False)
    assert fixed.ok, fixed
    assert fixed.rung("make_fx").status == "pass"


def test_a_write_the_schema_does_not_declare_is_mutation_undeclared(ns) -> None:
    source = """
        @torch.library.custom_op("NS::bump", mutates_args=())
        def bump(x: Tensor) -> Tensor:
            x.add_(1)
            return x.clone()
        """
    names = define(source, ns)
    found = doctor(names["bump"], torch.randn(3), until=EAGER, progress=False)
    assert "mutation-undeclared" in found.causes
    finding = next(f for f in found.findings if f.cause == "mutation-undeclared")
    assert finding.rung == "schema"
    assert finding.site == line_of(names, "@torch.library.custom_op", ns)
    assert finding.fix == f'@torch.library.custom_op("{ns}::bump", mutates_args={{"x"}})'
    declared = finding.fix.replace(ns, "NS")
    fixed = define(
        source.replace('@torch.library.custom_op("NS::bump", mutates_args=())', declared), ns
    )
    assert (
        "mutation-undeclared"
        not in doctor(fixed["bump"], torch.randn(3), rungs=["schema"], progress=False).causes
    )


def test_a_declared_write_the_kernel_never_makes_is_mutation_overdeclared(ns) -> None:
    names = define(
        """
        @torch.library.custom_op("NS::reads", mutates_args={"x"})
        def reads(x: Tensor) -> Tensor:
            return x * 2
        """,
        ns,
    )
    found = doctor(names["reads"], torch.randn(3), rungs=["schema"], progress=False)
    assert found.causes == {"mutation-overdeclared"}
    assert found.findings[0].fix == f'@torch.library.custom_op("{ns}::reads", mutates_args=())'


def test_a_kernel_returning_a_view_of_its_input_is_output_aliases_input_at_its_return(ns) -> None:
    names = define(
        """
        @torch.library.custom_op("NS::flat", mutates_args=())
        def flat(x: Tensor) -> Tensor:
            return x.view(-1)
        """,
        ns,
    )
    found = doctor(names["flat"], torch.randn(2, 3), until=EAGER, progress=False)
    assert found.causes == {"output-aliases-input"}
    (finding,) = found.findings
    assert finding.site == line_of(names, "return x.view(-1)", ns)
    assert finding.fix == "return x.view(-1).clone()"


def test_a_library_kernel_returning_its_input_is_found_by_storage(ns) -> None:
    library = torch.library.Library(ns, "DEF")
    try:
        library.define("same(Tensor x) -> Tensor")
        library.impl("same", lambda x: x, "CPU")
        library.impl("same", lambda x: torch.empty_like(x), "Meta")
        found = doctor(f"{ns}::same", torch.randn(3), rungs=["schema"], progress=False)
        assert found.causes == {"output-aliases-input"}
    finally:
        library._destroy()


def test_inputs_requiring_grad_without_an_autograd_formula_is_no_autograd(ns) -> None:
    names = define(
        TWICE + "\n@twice.register_fake\ndef _(x):\n    return torch.empty_like(x)\n", ns
    )
    found = doctor(names["twice"], torch.randn(3, requires_grad=True), until=EAGER, progress=False)
    assert found.causes == {"no-autograd"}
    assert found.findings[0].rung == "autograd"
    assert "register_autograd" in found.findings[0].fix
    assert found.rung("gradients").status == "skip"
    # without requires_grad the op counts as not differentiable: a skip, not a finding
    assert doctor(names["twice"], torch.randn(3), until=EAGER, progress=False).ok


def test_a_library_op_with_only_a_cpu_kernel_warns_on_backward_and_is_no_autograd(ns) -> None:
    library = torch.library.Library(ns, "DEF")
    try:
        library.define("double(Tensor x) -> Tensor")
        library.impl("double", lambda x: x * 2, "CPU")
        library.impl("double", lambda x: torch.empty_like(x), "Meta")
        found = doctor(
            f"{ns}::double", torch.randn(3, requires_grad=True), rungs=["autograd"], progress=False
        )
        assert found.causes == {"no-autograd"}
    finally:
        library._destroy()


MUL = """
@torch.library.custom_op("NS::mul", mutates_args=())
def mul(x: Tensor, y: Tensor) -> Tensor:
    return x * y

@mul.register_fake
def _(x, y):
    return torch.empty_like(x)

def setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)

def backward(ctx, grad):
    x, y = ctx.saved_tensors
    return BACKWARD

mul.register_autograd(backward, setup_context=setup_context)
"""


def test_a_backward_returning_too_few_gradients_is_backward_arity(ns) -> None:
    names = define(MUL.replace("BACKWARD", "grad * y"), ns)
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    found = doctor(names["mul"], x, y, until=EAGER, progress=False)
    assert found.causes == {"backward-arity"}
    (finding,) = found.findings
    assert finding.site == line_of(names, "def backward(ctx, grad):", ns)
    assert finding.fix.startswith("return grad_x, grad_y  # one per input (x, y)")


def test_a_backward_with_the_wrong_formula_is_backward_wrong_at_the_gradients_rung(ns) -> None:
    names = define(MUL.replace("BACKWARD", "grad * x, grad * y"), ns)  # swapped
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    found = doctor(names["mul"], x, y, until=EAGER, progress=False)
    assert found.causes == {"backward-wrong"}
    assert found.findings[0].rung == "gradients"
    assert "Jacobian mismatch" in found.findings[0].evidence
    fixed = define(MUL.replace("BACKWARD", "grad * y, grad * x"), ns)
    assert doctor(fixed["mul"], x, y, until=EAGER, progress=False).ok


def test_a_composite_implicit_kernel_beside_a_cpu_kernel_is_composite_shadows(ns) -> None:
    library = torch.library.Library(ns, "DEF")
    try:
        library.define("f(Tensor x) -> Tensor")
        library.impl("f", lambda x: x.sin(), "CompositeImplicitAutograd")
        library.impl("f", lambda x: x.sin(), "CPU")
        found = doctor(f"{ns}::f", torch.randn(3), until=EAGER, progress=False)
        assert "composite-shadows" in found.causes
        finding = next(f for f in found.findings if f.cause == "composite-shadows")
        assert finding.rung == "registrations"
        assert "CompositeImplicitAutograd:" in finding.evidence and "CPU:" in finding.evidence
        assert '"CompositeExplicitAutograd"' in finding.fix
    finally:
        library._destroy()


def test_a_sample_the_kernel_raises_on_is_the_users_error_naming_its_line(ns) -> None:
    names = define(
        """
        @torch.library.custom_op("NS::picky", mutates_args=())
        def picky(x: Tensor) -> Tensor:
            if x.dim() != 3:
                raise ValueError("picky takes 3-d tensors")
            return x * 2
        """,
        ns,
    )
    with pytest.raises(DoctorSampleError) as raised:
        doctor(names["picky"], torch.randn(3), progress=False)
    message = str(raised.value)
    assert "ValueError: picky takes 3-d tensors" in message
    assert line_of(names, "raise ValueError", ns) in message
    with pytest.raises(DoctorSampleError, match="built from the schema"):
        doctor(f"{ns}::picky", progress=False)


def test_healthy_ops_of_torch_itself_have_no_finding() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    assert doctor(torch.ops.aten.sin.default, x, until=EAGER, progress=False).ok
    assert doctor("aten::mm", x, torch.randn(4, 2), until=EAGER, progress=False).ok
    assert doctor("aten::nonzero", torch.randn(6), until=EAGER, progress=False).ok


def test_rungs_and_until_choose_the_rungs_and_bad_names_say_which_exist() -> None:
    found = doctor("aten::sin", torch.randn(2), rungs=["fake"], progress=False)
    climbed = [r.name for r in found.rungs if r.detail != "not asked for"]
    assert climbed == ["schema", "fake"]  # schema always runs: its results are the reference
    assert [r.name for r in found.rungs] == list(RUNG_NAMES)
    with pytest.raises(ArgumentTypeError, match="the rungs are registrations, schema"):
        doctor("aten::sin", torch.randn(2), until="compile", progress=False)
    with pytest.raises(ArgumentTypeError, match="unknown rung"):
        doctor("aten::sin", torch.randn(2), rungs=["fake", "nope"], progress=False)
    with pytest.raises(ArgumentTypeError, match="not both"):
        doctor("aten::sin", torch.randn(2), samples=[(torch.randn(2),)], progress=False)


def test_progress_is_reported_per_rung_to_a_callback() -> None:
    events = []
    doctor("aten::sin", torch.randn(2), until="fake", progress=events.append)
    assert [e.case for e in events[:-1]] == [
        "registrations",
        "schema vs behaviour",
        "fake signature",
        "fake vs real",
    ]
    assert events[-1].finished and events[-1].task == "doctor" and events[-1].unit == "rungs"


def test_every_cause_has_a_meaning_and_exceptions_map_onto_codes() -> None:
    assert {
        "no-fake",
        "fake-shape",
        "fake-strides",
        "fake-dtype",
        "fake-device",
        "fake-signature",
        "data-dependent-shape",
        "mutation-undeclared",
        "mutation-overdeclared",
        "output-aliases-input",
        "no-autograd",
        "backward-arity",
        "backward-wrong",
        "composite-shadows",
        "compile-failure",
        "export-failure",
    } <= set(CAUSES)
    assert classify(RuntimeError("Argument x is not defined as mutable but was mutated")) == (
        "mutation-undeclared"
    )
    assert classify(ValueError("something else")) is None


@pytest.mark.slow
def test_the_doctor_leaves_the_dispatcher_caches_configs_and_random_state_as_they_were(
    ns,
) -> None:
    """Under no_grad, with inputs that require grad: the autograd rungs need grad mode (which
    comes back off); with samples built from the schema (random tensors, drawn from a stream
    the user's never sees)."""
    from opmagic._torch import compilers

    names = define(MUL.replace("BACKWARD", "grad * y, grad * x"), ns)
    # torch registers operators lazily the first time it compiles and checks autograd with
    # opcheck: let that happen first
    doctor("aten::sin", torch.randn(2, requires_grad=True), until="aot_eager", progress=False)

    def users_code(x: Tensor) -> Tensor:
        return x.cos() + 1

    compiled = torch.compile(users_code, backend="eager")
    compiled(torch.randn(3))
    entries = compilers.compiled_entries(users_code.__code__)
    configs = compilers.global_configs()
    table = torch._C._dispatch_dump(f"{ns}::mul")
    state = DispatcherState.now()
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    torch.manual_seed(7)
    expected_draw = torch.randn(2)
    torch.manual_seed(7)
    with torch.no_grad():
        found = doctor(names["mul"], x, y, until="aot_eager", progress=False)
        assert not torch.is_grad_enabled()
    assert found.ok, found
    assert found.rung("gradients").status == "pass"
    assert doctor(names["mul"], until="fake", progress=False).ok  # random samples
    assert torch.equal(torch.randn(2), expected_draw)
    assert compilers.compiled_entries(users_code.__code__) == entries
    assert compilers.global_configs() == configs
    assert torch._C._dispatch_dump(f"{ns}::mul") == table
    assert DispatcherState.now() == state
    assert torch.equal(names["mul"](torch.ones(2), torch.ones(2)), torch.ones(2))


def test_gpu_rungs_skip_without_a_gpu_saying_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/verify/test_doctor_gpu.py covers it")
    found = doctor("aten::sin", torch.randn(3), rungs=["cuda_stream", "cuda_graph"], progress=False)
    assert [found.rung(name).detail for name in ("cuda_stream", "cuda_graph")] == [
        "no GPU here",
        "no GPU here",
    ]


COUNTER = """
calls = [0]

@torch.library.custom_op("NS::counted", mutates_args=())
def counted(x: Tensor) -> Tensor:
    calls[0] += 1
    return x * calls[0]

@counted.register_fake
def _(x):
    return torch.empty_like(x)
"""


@pytest.mark.slow
def test_compiled_results_that_differ_from_eager_are_compile_failure(ns) -> None:
    """Runs torch.compile (aot_eager). A kernel whose result depends on hidden state passes
    every eager rung, and differs once compiled: what no other code explains."""
    names = define(COUNTER, ns)
    found = doctor(names["counted"], torch.ones(3), rungs=["fake", "aot_eager"], progress=False)
    assert found.causes == {"compile-failure"}
    (finding,) = found.findings
    assert finding.rung == "aot_eager"
    assert "Tensor-likes are not close" in finding.message
    assert finding.site == line_of(names, "@torch.library.custom_op", ns)


VMAP = """
@torch.library.custom_op("NS::double", mutates_args=())
def double(x: Tensor) -> Tensor:
    return x * 2

@double.register_fake
def _(x):
    return torch.empty_like(x)

@double.register_vmap
def _(info, in_dims, x):
    return x * FACTOR, in_dims[0]
"""


def test_a_vmap_rule_is_checked_against_the_op_run_per_sample(ns) -> None:
    healthy = define(VMAP.replace("FACTOR", "2"), ns)
    found = doctor(healthy["double"], torch.randn(3), rungs=["vmap"], progress=False)
    assert found.ok and found.rung("vmap").status == "pass"
    wrong = define(VMAP.replace("FACTOR", "3"), ns)
    found = doctor(wrong["double"], torch.randn(3), rungs=["vmap"], progress=False)
    assert found.causes == {"vmap-wrong"}
    assert found.findings[0].site == line_of(wrong, "@double.register_vmap", ns)
    assert doctor("aten::sin", torch.randn(3), rungs=["vmap"], progress=False).ok  # C++ rule
    plain = define(TWICE, ns)["twice"]
    skipped = doctor(plain, torch.randn(3), rungs=["vmap"], progress=False).rung("vmap")
    assert skipped.status == "skip" and skipped.detail.startswith("the op registers no vmap")
