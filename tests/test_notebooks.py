"""Every notebook in notebooks/ runs top to bottom, and none is stale against its source.

Each notebook is built from its percent-format source in notebooks/src/ and
executed with nbclient in a fresh kernel of this very interpreter (checked by
a probe cell added in front), with a time limit per cell; a cell that raises,
an assertion in a notebook included, fails the test. The committed .ipynb
files must hold exactly the cells their source builds, run, with their
outputs (plots included). The notebooks on the real SmolLM2 are marked
``real_model`` and skip when the model cannot be had.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from tests.real_models import SMOLLM2, real_model_or_skip  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
REAL_MODEL = {"04_sampling_and_speculative.ipynb", "05_chat_smollm2.ipynb"}
PROBE = "import sys; print(sys.prefix)"


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", NOTEBOOKS / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILDER = _builder()


def test_there_are_eight_notebooks_each_built_from_its_source():
    assert len(BUILDER.NOTEBOOKS) == 8
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == BUILDER.NOTEBOOKS


@pytest.mark.parametrize("name", BUILDER.NOTEBOOKS)
def test_committed_notebook_is_current_with_its_outputs(name):
    reason = BUILDER.stale_reason(name)
    assert reason is None, f"{name}: {reason}; run python notebooks/build_notebooks.py {name.removesuffix('.ipynb')}"
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    draws = sum(c.source.count("plt.show()") for c in notebook.cells if c.cell_type == "code")
    plots = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(plots) >= min(draws, 1), f"{name} draws pictures but none was saved"  # what a learner browsing sees


def test_a_stale_notebook_is_caught(tmp_path, monkeypatch):
    """The staleness check itself: an edited source, and a notebook saved without outputs, are both reported."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "07_demo.py").write_text("# %% [markdown]\n# # Demo\n\n# %%\nprint(1 + 1)\n")
    monkeypatch.setattr(BUILDER, "SOURCES", source)
    monkeypatch.setattr(BUILDER, "HERE", tmp_path)
    assert BUILDER.stale_reason("07_demo.ipynb") == "not built"
    nbformat.write(BUILDER.build("07_demo.ipynb"), tmp_path / "07_demo.ipynb")
    assert BUILDER.stale_reason("07_demo.ipynb") == "saved without its outputs"
    (source / "07_demo.py").write_text("# %% [markdown]\n# # Demo\n\n# %%\nprint(2 + 2)\n")
    assert BUILDER.stale_reason("07_demo.ipynb") == "its cells differ from its source"


def _params():
    for name in BUILDER.NOTEBOOKS:
        marks = [pytest.mark.real_model, pytest.mark.slow] if name in REAL_MODEL else []
        yield pytest.param(name, marks=marks, id=name.removesuffix(".ipynb"))


@pytest.mark.parametrize("name", list(_params()))
def test_notebook_runs(name):
    if name in REAL_MODEL:
        real_model_or_skip(SMOLLM2)
    notebook = BUILDER.build(name)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(PROBE, id="probe"))
    start = time.perf_counter()
    BUILDER.execute(notebook)
    seconds = time.perf_counter() - start

    kernel_prefix = "".join(out.get("text", "") for out in notebook.cells[0].outputs).strip()
    assert Path(kernel_prefix).resolve() == Path(sys.prefix).resolve(), (
        f"the notebook ran in {kernel_prefix}, not in this environment ({sys.prefix}):"
        " a 'python3' kernelspec elsewhere shadows this one"
    )
    print(f"{name}: {seconds:.1f} s")
