"""The torch.compile shims of opmagic/_torch/compilers.py that the session uses."""

from __future__ import annotations

import pytest
import torch

from opmagic._torch import compilers


@pytest.mark.slow
def test_forget_all_compiled_code_makes_compiled_functions_trace_again() -> None:
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(lambda x: x.sin() + 1, backend=counting_backend)
    compiled(torch.ones(2))
    compiled(torch.ones(2))
    assert len(graphs) == 1
    compilers.forget_all_compiled_code()
    compiled(torch.ones(2))
    assert len(graphs) == 2
