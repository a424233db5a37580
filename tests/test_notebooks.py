"""Every notebook in notebooks/ runs top to bottom, so none of them rots.

Each notebook is executed with nbclient in a fresh kernel of this very
interpreter (checked by a probe cell added in front), with a time limit per
cell; a cell that raises, an assertion in a notebook included, fails the test.
The notebooks on the real SmolLM2 are marked ``real_model`` and skip when the
model cannot be had. The committed .ipynb files must hold exactly the cells
notebooks/build_notebooks.py writes, without outputs.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from tests.real_models import SMOLLM2, real_model_or_skip  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT = 240  # seconds; the slowest cell (04's greedy and speculative runs) takes under a minute
REAL_MODEL = {"04_sampling_and_speculative.ipynb", "05_chat_smollm2.ipynb"}
PROBE = "import sys; print(sys.prefix)"


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", NOTEBOOKS / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILDER = _builder()


def test_notebooks_match_their_source():
    """Each .ipynb holds the cells notebooks/build_notebooks.py writes, without outputs."""
    stale = [name for name in BUILDER.NOTEBOOKS if not BUILDER.is_current(name)]
    assert not stale, f"{', '.join(stale)}: out of date or saved with outputs; run python notebooks/build_notebooks.py"
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(BUILDER.NOTEBOOKS)


def _params():
    for name in BUILDER.NOTEBOOKS:
        marks = [pytest.mark.real_model, pytest.mark.slow] if name in REAL_MODEL else []
        yield pytest.param(name, marks=marks, id=name.removesuffix(".ipynb"))


@pytest.mark.parametrize("name", list(_params()))
def test_notebook_runs(name):
    if name in REAL_MODEL:
        real_model_or_skip(SMOLLM2)
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(PROBE, id="probe"))
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start

    kernel_prefix = "".join(out.get("text", "") for out in notebook.cells[0].outputs).strip()
    assert Path(kernel_prefix).resolve() == Path(sys.prefix).resolve(), (
        f"the notebook ran in {kernel_prefix}, not in this environment ({sys.prefix}):"
        " a 'python3' kernelspec elsewhere shadows this one"
    )
    print(f"{name}: {seconds:.1f} s")
