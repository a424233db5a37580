"""Every notebook in notebooks/ runs top to bottom, and none is stale against its source.

Each notebook is built from its percent-format source in notebooks/src/ and
executed with nbclient in a fresh kernel of this very interpreter (checked by
a probe cell added in front), with a time limit per cell; a cell that raises,
an assertion in a notebook included, fails the test. The committed .ipynb
files must hold exactly the cells their source builds, run, with their
outputs (plots included), and those outputs must be what a fresh run shows
(timings masked, pictures compared by kind): an output left from an older
build fails. The notebooks on the real SmolLM2 are marked ``real_model`` and
skip when the model cannot be had.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from tests.helpers.paths import ROOT
from tests.helpers.real_models import SMOLLM2, real_model_or_skip

NOTEBOOKS = ROOT / "notebooks"
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
def test_every_notebook_has_pictures(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert sum(kind == "<image/png>" for _, outputs in BUILDER.shown(notebook) for kind in outputs) >= 1


def test_a_stale_output_is_caught_and_a_timing_is_not():
    """The output comparison itself: what a fresh run would not show is reported by cell; a duration is not."""

    def ran(*texts: str, picture: bool = False) -> nbformat.NotebookNode:
        cells = [nbformat.v4.new_code_cell("...", id=f"cell-{i:02d}") for i in range(len(texts))]
        for cell, text in zip(cells, texts):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        if picture:
            cells[-1].outputs.append(nbformat.v4.new_output("display_data", data={"image/png": "iVBOR"}))
        return nbformat.v4.new_notebook(cells=cells)

    saved = ran("answer 42\n", "done in 1.5 s, 31.2 tokens/s\n", picture=True)
    assert BUILDER.output_differences(saved, ran("answer 42\n", "done in 0.3 s, 9.0 tokens/s\n", picture=True)) == []
    assert BUILDER.output_differences(saved, ran("answer 43\n", "done in 1.5 s, 31.2 tokens/s\n", picture=True)) == [
        "cell-00: saved 'stdout: answer 42\\n', a fresh run shows 'stdout: answer 43\\n'"
    ]
    assert [d.split(":")[0] for d in BUILDER.output_differences(saved, ran("answer 42\n", "done in 1.5 s\n"))] == [
        "cell-01"
    ]  # a picture gone, a line changed
    split = ran("answer 42\n", "done in 1.5 s, 31.2 tokens/s\n", picture=True)
    split.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in ("answer ", "42\n")]
    assert BUILDER.output_differences(saved, split) == []  # one stream, flushed in two pieces
    split.cells[0].outputs[1].text = "43\n"
    assert [d.split(":")[0] for d in BUILDER.output_differences(saved, split)] == ["cell-00"]
    committed = nbformat.read(NOTEBOOKS / "01_forward_pass.ipynb", as_version=4)
    edited = nbformat.from_dict(json.loads(json.dumps(committed)))
    cell = next(c for c in edited.cells if c.cell_type == "code" and any(o.output_type == "stream" for o in c.outputs))
    next(o for o in cell.outputs if o.output_type == "stream").text += "a line no run prints\n"
    assert [d.split(":")[0] for d in BUILDER.output_differences(edited, committed)] == [cell.id]


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
    notebook.cells.pop(0)
    saved = nbformat.read(NOTEBOOKS / name, as_version=4)
    stale = BUILDER.output_differences(saved, notebook)
    assert stale == [], f"{name} holds outputs a fresh run does not show; rebuild it:\n" + "\n".join(stale)
