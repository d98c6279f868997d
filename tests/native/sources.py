"""C++ sources the build and magic tests compile."""

from __future__ import annotations

# the minimal headers of an operator library: every source below uses the "core" header set
MINIMAL_INCLUDES = "#include <torch/library.h>\n#include <ATen/core/Tensor.h>\n"

# the quick path's vector add: an extern "C" kernel NVRTC compiles and a launcher binds
VADD = (
    'extern "C" __global__ void vadd(const float* a, const float* b, float* out, int n) {\n'
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = a[i] + b[i];\n"
    "}\n"
)


def op_source(
    namespace: str,
    *,
    schema: str = "scale(Tensor x) -> Tensor",
    kernel: str = "at::Tensor scale(const at::Tensor& x) { return x.mul(2); }",
    op: str = "scale",
    extra: str = "",
) -> str:
    """A library defining one operator with a CPU kernel (line 4: TORCH_LIBRARY, line 10: IMPL)."""
    return (
        f"{MINIMAL_INCLUDES}"
        "\n"
        f"TORCH_LIBRARY({namespace}, m) {{\n"  # line 4
        f'  m.def("{schema}");\n'  # line 5
        "}\n"
        "\n"
        f"{kernel}\n"  # line 8
        "\n"
        f"TORCH_LIBRARY_IMPL({namespace}, CPU, m) {{\n"  # line 10
        f'  m.impl("{op}", {op});\n'
        "}\n"
        f"{extra}"
    )


def reload_variant(namespace: str, version: int) -> tuple[str, str, float]:
    """One of seven versions of a library whose schema and kernel change between versions.

    Returns ``(source, expected schema, what op(x=ones) returns)``. Odd versions take an
    extra ``float`` argument; every version's kernel adds its own constant; versions
    divisible by three define a second operator, which the others must not leave behind.
    """
    version %= 7
    if version % 2:
        schema = "step(Tensor x, float y=0.5) -> Tensor"
        kernel = (
            f"at::Tensor step(const at::Tensor& x, double y) {{ return x.add({version}).add(y); }}"
        )
        value = 1 + version + 0.5
    else:
        schema = "step(Tensor x) -> Tensor"
        kernel = f"at::Tensor step(const at::Tensor& x) {{ return x.add({version}); }}"
        value = 1 + version
    extra = ""
    if version % 3 == 0:
        extra = (
            f"TORCH_LIBRARY_FRAGMENT({namespace}, m) {{\n"
            f'  m.def("extra_{version}(Tensor x) -> Tensor");\n'
            "}\n"
        )
    source = op_source(namespace, schema=schema, kernel=kernel, op="step", extra=extra)
    return source, f"{namespace}::{schema}", value


# the stable ABI's headers, as PyTorch's custom C++ operator tutorial includes them
STABLE_INCLUDES = (
    "#include <torch/csrc/stable/library.h>\n"
    "#include <torch/csrc/stable/ops.h>\n"
    "#include <torch/csrc/stable/tensor.h>\n"
)


def stable_op_source(
    namespace: str,
    *,
    schema: str = "fill(Tensor x) -> Tensor",
    kernel: str = (
        "torch::stable::Tensor fill(const torch::stable::Tensor& x) {\n"
        "  return torch::stable::fill_(torch::stable::empty_like(x), 2.0);\n"
        "}"
    ),
    op: str = "fill",
) -> str:
    """A stable-ABI library defining one operator with a CPU kernel (for a three-line kernel,
    line 7: STABLE_TORCH_LIBRARY, line 10: STABLE_TORCH_LIBRARY_IMPL)."""
    return (
        f"{STABLE_INCLUDES}"
        f"{kernel}\n"  # line 4
        f"STABLE_TORCH_LIBRARY({namespace}, m) {{\n"
        f'  m.def("{schema}");\n'
        "}\n"
        f"STABLE_TORCH_LIBRARY_IMPL({namespace}, CPU, m) {{\n"
        f'  m.impl("{op}", TORCH_BOX(&{op}));\n'
        "}\n"
    )


def stable_scale_source(namespace: str, value: str = "2.0", before: str = "") -> str:
    """A stable-ABI library whose op ``scale(Tensor x) -> Tensor`` returns a tensor like ``x``
    filled with ``value`` (what ``op_source``'s op makes of a one), after ``before``.

    For tests of what a build does rather than of the headers it includes: the stable set is
    the smallest (without precompiled headers it compiles in a third of the core set's time,
    and precompiles in ~5 s against ~20 s)."""
    kernel = (
        f"{before}torch::stable::Tensor scale(const torch::stable::Tensor& x) {{\n"
        f"  return torch::stable::fill_(torch::stable::empty_like(x), {value});\n"
        "}"
    )
    return stable_op_source(
        namespace, schema="scale(Tensor x) -> Tensor", kernel=kernel, op="scale"
    )
