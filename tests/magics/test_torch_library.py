"""``%%torch_library`` in a real IPython shell: cells compile, re-runs replace, errors stop."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from torch._subclasses.fake_tensor import FakeTensorMode

from opmagic import active_session
from opmagic._torch import dispatcher
from opmagic.errors import BuildOptionError, CompileError, RegistrationError
from opmagic.magics import WARM_UPS
from opmagic.magics.torch_library import DisplayProgress, TorchLibraryMagics
from opmagic.native import LoadedLibrary, compile_library
from opmagic.native.headers import precompile_headers_in_background

from ..conftest import running_in_group, stop_background_precompiles
from ..native.sources import MINIMAL_INCLUDES, op_source, reload_variant, stable_op_source


@pytest.fixture(scope="module")
def shell(ipython) -> Iterator[Any]:
    """The test shell with ``%load_ext opmagic`` done (undone after the module)."""
    ipython.run_line_magic("load_ext", "opmagic")
    ipython.run_cell("import torch")
    yield ipython
    ipython.run_line_magic("unload_ext", "opmagic")


@pytest.fixture
def magics(shell) -> Iterator[TorchLibraryMagics]:
    """The shell's %%torch_library instance; what a test's cells loaded is closed after it
    (by reloading the extension, whose session closes every library it tracks)."""
    yield shell.magics_manager.registry["TorchLibraryMagics"]
    shell.run_line_magic("unload_ext", "opmagic")
    shell.run_line_magic("load_ext", "opmagic")


def tracked_libraries() -> list[LoadedLibrary]:
    """The open libraries the session tracks for its cells, oldest first."""
    session = active_session()
    assert session is not None
    return [
        tracked.handle
        for record in session.records()
        for tracked in record.handles
        if tracked.is_open and isinstance(tracked.handle, LoadedLibrary)
    ]


def run(shell: Any, line: str, source: str, cell_id: str | None = None) -> Any:
    """Run a %%torch_library cell; the ExecutionResult (its output is captured)."""
    with capture_output():
        return shell.run_cell(f"%%torch_library {line}\n{source}", cell_id=cell_id)


def test_the_magic_documents_its_options(shell):
    doc = shell.find_cell_magic("torch_library").__doc__
    for option in ("--name", "--opt", "--include", "--cflags", "--ldflags", "--no-pch"):
        assert option in doc
    assert "--force" in doc and "--verbose" in doc


def test_display_progress_updates_one_output_in_place_then_empties_it(shell):
    """Build events and --verify's step lines replace each other in one output; clear()
    empties it, and shows nothing when nothing was shown."""
    with capture_output() as nothing_shown:
        DisplayProgress().clear()
    assert nothing_shown.outputs == []
    with capture_output() as shown:
        progress = DisplayProgress()
        progress("building ops")
        progress("step 1/6: build the wheel")
        progress.clear()
    assert [(o.data, o.update) for o in shown.outputs] == [
        ({"text/plain": "building ops"}, False),
        ({"text/plain": "step 1/6: build the wheel"}, True),
        ({"text/plain": ""}, True),
    ]


@pytest.mark.slow
def test_a_cell_registers_its_ops_and_shows_them_at_cell_lines(shell, magics):
    result = run(shell, "", op_source("mg_basic"), cell_id="mg-basic")
    assert result.success
    library = result.result
    assert isinstance(library, LoadedLibrary) and library.label.startswith("cell [")
    assert library.where(library.operators[0].line) == f"{library.label}, line 5"  # magic: line 1
    assert f"mg_basic::scale(Tensor x) -> Tensor  {library.label}, line 5" in str(library)
    assert shell.run_cell("torch.ops.mg_basic.scale(torch.ones(1)).item()").result == 2.0
    assert tracked_libraries() == [library]


@pytest.mark.slow
def test_twenty_edit_and_rerun_cycles_replace_schemas_and_kernels(shell, magics):
    x = torch.ones(2)
    for cycle in range(20):
        source, schema, value = reload_variant("mg_cycle", cycle)
        result = run(shell, "", source, cell_id="mg-cycle")
        assert result.success, result.error_in_exec
        assert str(dispatcher.find_schema("mg_cycle::step", "")) == schema
        assert torch.ops.mg_cycle.step(x).tolist() == [value, value]
        extras = {n for n in dispatcher.all_op_names() if n.startswith("mg_cycle::extra_")}
        assert extras == ({f"mg_cycle::extra_{cycle % 7}"} if cycle % 7 % 3 == 0 else set())
        assert tracked_libraries() == [result.result]


@pytest.mark.slow
def test_a_compile_error_stops_the_run_and_keeps_the_previous_version(shell, magics):
    assert run(shell, "", op_source("mg_error"), cell_id="mg-error").success
    broken = op_source("mg_error", kernel="at::Tensor scale(const at::Tensor& x) { return y; }")
    with capture_output() as captured:
        result = shell.run_cell(f"%%torch_library\n{broken}", cell_id="mg-error")
    assert isinstance(result.error_in_exec, CompileError)
    assert "'y' was not declared in this scope" in captured.stdout
    assert "Traceback" not in captured.stdout  # the C++ error, not opmagic's Python frames
    assert shell.run_cell("torch.ops.mg_error.scale(torch.ones(1)).item()").result == 2.0


@pytest.mark.slow
def test_in_a_notebook_progress_updates_in_place_and_errors_show_the_cell_line(
    shell, magics, monkeypatch
):
    monkeypatch.setattr(shell, "kernel", object(), raising=False)  # as in ipykernel's shell
    formats = [*shell.display_formatter.active_types, "text/html"]  # a terminal shows text only
    monkeypatch.setattr(shell.display_formatter, "active_types", formats)
    broken = op_source("mg_notebook", kernel="at::Tensor scale(const at::Tensor& x) { return; }")
    with capture_output() as captured:
        result = shell.run_cell(f"%%torch_library\n{broken}", cell_id="mg-notebook")
    assert isinstance(result.error_in_exec, CompileError)
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert any(t.startswith("opmagic: libmg_notebook.so: compiling") for t in texts)
    html = captured.outputs[-1].data["text/html"]  # the progress output, replaced by the error
    assert "<details>" in html and "return-statement with no value" in html
    assert "CompileError" not in captured.stdout  # shown once: no traceback after it


@pytest.mark.slow
def test_a_registration_error_names_the_cell_line_and_keeps_the_previous_version(shell, magics):
    assert run(shell, "", op_source("mg_reg"), cell_id="mg-reg").success
    duplicate = op_source("mg_reg").replace(
        '  m.def("scale(Tensor x) -> Tensor");',
        '  m.def("scale(Tensor x) -> Tensor");\n  m.def("scale(Tensor x) -> Tensor");',
    )
    with capture_output() as captured:
        result = shell.run_cell(f"%%torch_library\n{duplicate}", cell_id="mg-reg")
    assert isinstance(result.error_in_exec, RegistrationError)
    shown = " ".join(captured.stdout.split())  # wrapped to the terminal's width
    assert ", line 5: Tried to register an operator (mg_reg::scale" in shown
    assert shell.run_cell("torch.ops.mg_reg.scale(torch.ones(1)).item()").result == 2.0


@pytest.mark.slow
def test_an_edit_that_changes_kernel_signatures_drops_other_cells_kernels_on_the_op(shell, magics):
    """The tutorials' flow: a C++ cell, a Python cell with the operator's fake impl, then the
    C++ cell edited to take one more argument. The fake impl's Meta kernel kept the operator's
    dispatcher entry, which remembers the old kernel signature: it goes, as when a cell
    redefines the operator, and comes back when the edited cell fails all the same."""
    fake = 'torch.library.register_fake("mg_sig::scale", lambda x, n=3: torch.empty_like(x))'
    edited = op_source(
        "mg_sig",
        schema="scale(Tensor x, int n=3) -> Tensor",
        kernel="at::Tensor scale(const at::Tensor& x, int64_t n) { return x.mul(n); }",
    )
    assert run(shell, "", op_source("mg_sig"), cell_id="mg-sig").success
    assert shell.run_cell(fake, cell_id="mg-sig-fake").success
    result = run(shell, "", edited, cell_id="mg-sig")
    assert result.success, result.error_in_exec
    assert torch.ops.mg_sig.scale(torch.ones(1)).item() == 3.0
    dropped = "fake impl for mg_sig::scale (re-run that cell to add it again)"
    assert any(n.startswith("dropped cell") and n.endswith(dropped) for n in result.result.notes)

    # a kernel of the old signature in another C++ cell: the edit fails, the fake impl stays
    magics.shell.run_line_magic("unload_ext", "opmagic")
    magics.shell.run_line_magic("load_ext", "opmagic")
    assert run(shell, "", op_source("mg_sig"), cell_id="mg-sig").success
    assert shell.run_cell(fake, cell_id="mg-sig-fake").success
    old_kernel = MINIMAL_INCLUDES + (
        "at::Tensor keep(const at::Tensor& x) { return x; }\n"
        'TORCH_LIBRARY_IMPL(mg_sig, AutocastCPU, m) {\n  m.impl("scale", keep);\n}\n'
    )
    assert run(shell, "", old_kernel, cell_id="mg-sig-autocast").success
    assert isinstance(run(shell, "", edited, cell_id="mg-sig").error_in_exec, RegistrationError)
    with FakeTensorMode():
        assert torch.ops.mg_sig.scale(torch.ones(2)).shape == (2,)


@pytest.mark.slow
def test_without_cell_ids_a_cell_is_recognised_by_the_namespace_it_defines(shell, magics):
    assert run(shell, "", op_source("mg_noid")).success
    edited = op_source("mg_noid", kernel="at::Tensor scale(const at::Tensor& x) { return x; }")
    result = run(shell, "", edited)
    assert result.success, result.error_in_exec
    assert shell.run_cell("torch.ops.mg_noid.scale(torch.ones(1)).item()").result == 1.0
    assert tracked_libraries() == [result.result]


@pytest.mark.slow
def test_a_new_cell_defining_the_namespace_replaces_the_earlier_cells_library(shell, magics):
    """In JupyterLab every cell has an id: a later cell defining a namespace an earlier cell
    defined replaces that cell's library (torch keeps one TORCH_LIBRARY per namespace), as a
    later %%custom_op replaces an op, and its notes name that cell."""
    first = run(shell, "", op_source("mg_later"), cell_id="mg-later-1")
    assert first.success, first.error_in_exec
    edited = op_source("mg_later", kernel="at::Tensor scale(const at::Tensor& x) { return x; }")
    second = run(shell, "", edited, cell_id="mg-later-2")
    assert second.success, second.error_in_exec
    assert first.result.closed and tracked_libraries() == [second.result]
    note = f"replaced {first.result.label}'s C++ library mg_later: mg_later::scale"
    assert second.result.notes == (f"{note}; 1 kernels",)
    assert f"note: {note}" in str(second.result)
    assert shell.run_cell("torch.ops.mg_later.scale(torch.ones(1)).item()").result == 1.0
    again = run(shell, "", edited, cell_id="mg-later-2")  # its own re-run: nothing to note
    assert again.success and again.result.notes == ()


@pytest.mark.slow
def test_options_reach_compile_library(shell, magics, tmp_path, capsys):
    (tmp_path / "offset.h").write_text("constexpr int kOffset = 40;\n")
    source = op_source(
        "mg_options",
        kernel='#include "offset.h"\n'
        "at::Tensor scale(const at::Tensor& x) { return x.add(kOffset + BONUS); }",
    )
    line = f'--name optlib --cflags="-DBONUS=2" -I {tmp_path} --force --verbose'
    with capture_output() as captured:
        result = shell.run_cell(f"%%torch_library {line}\n{source}", cell_id="mg-options")
    assert result.success, result.error_in_exec
    library = result.result
    assert library.path.name == "liboptlib.so" and not library.build.cached
    assert "-DBONUS=2" in captured.stderr and f"-I{tmp_path}" in captured.stderr  # --verbose
    assert shell.run_cell("torch.ops.mg_options.scale(torch.zeros(1)).item()").result == 42.0


def test_bad_options_are_refused_with_the_magic_named(shell, magics):
    with capture_output():
        result = shell.run_cell("%%torch_library --opt 7\n" + op_source("mg_bad"))
    assert isinstance(result.error_in_exec, BuildOptionError)
    assert str(result.error_in_exec).startswith("%%torch_library: Unknown optimisation level")
    with capture_output():
        result = shell.run_cell("%%torch_library --no-such-option\n" + op_source("mg_bad"))
    assert isinstance(result.error_in_exec, UsageError)


@pytest.mark.slow
def test_a_stable_abi_cell_reruns_like_a_classic_one(shell, magics):
    result = run(shell, "", stable_op_source("mg_stable"), cell_id="mg-stable")
    assert result.success, result.error_in_exec
    library = result.result
    assert f"mg_stable::fill(Tensor x) -> Tensor  {library.label}, line 8" in str(library)
    assert re.search(rf"CPU +mg_stable::fill +{re.escape(library.label)}, line 11", str(library))
    edited = run(
        shell, "", stable_op_source("mg_stable").replace("2.0", "3.0"), cell_id="mg-stable"
    )
    assert edited.success, edited.error_in_exec
    assert library.closed and tracked_libraries() == [edited.result]
    assert shell.run_cell("torch.ops.mg_stable.fill(torch.ones(1)).item()").result == 3.0
    broken = run(
        shell, "", stable_op_source("mg_stable").replace("2.0);", "2.0)"), cell_id="mg-stable"
    )
    assert isinstance(broken.error_in_exec, CompileError)
    assert shell.run_cell("torch.ops.mg_stable.fill(torch.ones(1)).item()").result == 3.0


@pytest.mark.slow
def test_unload_unregisters_every_library_the_cells_loaded(shell):
    assert run(shell, "", op_source("mg_close"), cell_id="mg-close").success
    assert run(shell, "", op_source("mg_close2")).success
    assert run(shell, "", stable_op_source("mg_close3")).success
    assert dispatcher.find_schema("mg_close::scale", "") is not None
    shell.run_line_magic("unload_ext", "opmagic")
    try:
        assert dispatcher.find_schema("mg_close::scale", "") is None
        assert dispatcher.find_schema("mg_close2::scale", "") is None
        assert not any(n.startswith("mg_close3::") for n in dispatcher.all_op_names())
    finally:
        shell.run_line_magic("load_ext", "opmagic")


@pytest.mark.slow
def test_load_ext_starts_precompiling_the_headers_of_the_first_cells(tmp_path, monkeypatch):
    """The warm-up ``%load_ext opmagic`` runs: on an empty cache it starts precompiling the
    stable, core and types sets, one after another, in a background process and returns; a
    stable-ABI build once the stable set is done uses its header (the test then ends that
    process: the other two sets cost a minute of CPU and take the same path)."""
    assert ("opmagic.native.headers", "precompile_headers_in_background") in WARM_UPS
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    precompile_headers_in_background()
    markers = list(tmp_path.glob("**/prefix/*/precompiling.pid"))
    assert len(markers) == 3  # started, not done
    # on CPU time nothing else wants: it never slows the cell the user waits for
    assert os.sched_getscheduler(int(markers[0].read_text())) == os.SCHED_IDLE
    assert not list(tmp_path.glob("**/prefix/*/prefix.h.gch"))
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("**/prefix/*/precompiling.pid"))) == 3:  # the stable set's
        assert time.monotonic() < deadline, "the stable set was not precompiled in 300 s"
        time.sleep(0.1)
    stop_background_precompiles(tmp_path)
    (done,) = tmp_path.glob("**/prefix/*/prefix.h.gch")
    assert "(stable, stable blocks)" in (done.parent / "prefix.h").read_text().splitlines()[0]
    library = compile_library(stable_op_source("tl_warm"), progress=None)
    try:
        assert library.build.precompiled and library.build.headers_seconds == 0
    finally:
        library.close()


@pytest.mark.slow
def test_the_test_run_ends_the_background_precompiles_it_started(tmp_path, monkeypatch):
    """What the session-end fixture does (tests/conftest.py): the precompile ``%load_ext``
    starts outlives the process that started it, until the run ends it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    precompile_headers_in_background()
    pids = {int(marker.read_text()) for marker in tmp_path.glob("**/precompiling.pid")}
    assert pids
    assert set(stop_background_precompiles(tmp_path)) == pids
    deadline = time.monotonic() + 10  # the compiler may take a moment to die of its SIGTERM
    while any(running_in_group(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running_in_group(pid) for pid in pids)  # the shell and the compiler it ran
