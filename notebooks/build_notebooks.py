"""Build the notebooks of this folder from their sources in src/, and run them so they carry their outputs.

    python notebooks/build_notebooks.py                # run every src/NN_name.py, write NN_name.ipynb with outputs
    python notebooks/build_notebooks.py 02_rope        # only the notebooks named
    python notebooks/build_notebooks.py --check        # exit 1 if a committed notebook is stale against its source

A source is a Python file in the percent format that jupytext reads and writes:
``# %%`` starts a code cell, ``# %% [markdown]`` a text cell whose lines are
comments (``# `` taken off). Edit the source, build, and commit both: the
source is what a review reads, the .ipynb (with its plots) what a learner opens.
Cells get fixed ids, so a notebook's cells change only when its source does.
``tests/test_notebooks.py`` runs every notebook again, checks none is stale against its
source, and compares what each cell showed with what the committed notebook shows
(``shown``: timings masked, pictures by kind), so an output left from an older build fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
CELL_TIMEOUT = 240  # seconds; the slowest cell (04's greedy and speculative runs) takes under a minute
NOTEBOOKS = sorted(path.stem + ".ipynb" for path in SOURCES.glob("*.py"))


def cells(source: str) -> list[nbformat.NotebookNode]:
    """The cells of a percent-format source, in order."""
    chunks: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        if line.startswith("# %%"):
            chunks.append(("markdown" if "[markdown]" in line else "code", []))
        elif chunks:
            chunks[-1][1].append(line)
    built = []
    for kind, lines in chunks:
        if kind == "markdown":
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines)
            built.append(new_markdown_cell(text.strip("\n")))
        else:
            built.append(new_code_cell("\n".join(lines).strip("\n")))
    return built


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (NN_name.ipynb) from its source, with fixed cell ids and no outputs."""
    notebook_cells = cells((SOURCES / name.replace(".ipynb", ".py")).read_text(encoding="utf-8"))
    for index, cell in enumerate(notebook_cells):
        cell["id"] = f"cell-{index:02d}"
    notebook = new_notebook(
        cells=notebook_cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    )
    nbformat.validate(notebook)
    return notebook


def execute(notebook: nbformat.NotebookNode, kernel_name: str = "python3") -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel, in this folder; a cell that raises raises here (CellExecutionError)."""
    import nbclient

    client = nbclient.NotebookClient(
        notebook,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT,
        record_timing=False,
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()
    return notebook


# What differs from run to run on the same code: durations and speeds, and object addresses.
VARYING = re.compile(r"\d+(?:\.\d+)?\s*(?:tokens/s|ms|µs|s)\b|0x[0-9a-f]{6,}")


def shown(notebook: nbformat.NotebookNode) -> list[tuple[str, list[str]]]:
    """What each code cell showed: (id, its outputs as text, with VARYING masked, a picture as its
    kind and consecutive pieces of one stream joined), to compare a notebook's saved outputs with a fresh run's."""
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        outputs, previous_stream = [], None
        for output in cell.get("outputs", []):
            stream = output.name if output.output_type == "stream" else None
            if stream is not None and stream == previous_stream:
                outputs[-1] += output.text  # one stream, split where the kernel happened to flush it
            elif stream is not None:
                outputs.append(f"{stream}: {output.text}")
            elif output.output_type == "error":
                outputs.append(f"error: {output.ename}: {output.evalue}")
            else:
                data = output.get("data", {})
                outputs.append(next((f"<{kind}>" for kind in ("image/png", "image/svg+xml") if kind in data), None)
                               or data.get("text/plain", ""))  # fmt: skip
            previous_stream = stream
        cells.append((cell.get("id", ""), [VARYING.sub("<varies>", text) for text in outputs]))
    return cells


def output_differences(saved: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """Where a saved notebook's outputs are not what a fresh run shows: one line per cell that differs."""
    differences = []
    for (cell, was), (_, now) in zip(shown(saved), shown(fresh)):
        if was != now:
            first = next((i for i, (a, b) in enumerate(zip(was, now)) if a != b), min(len(was), len(now)))
            saved_text = was[first] if first < len(was) else "nothing"
            fresh_text = now[first] if first < len(now) else "nothing"
            differences.append(f"{cell}: saved {saved_text[:200]!r}, a fresh run shows {fresh_text[:200]!r}")
    return differences


def content(notebook: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """What a notebook says, free of outputs: (id, cell type, source) per cell."""
    return [(cell.get("id", ""), cell.cell_type, cell.source) for cell in notebook.cells]


def stale_reason(name: str) -> str | None:
    """Why the committed ``name`` does not match its source (None when it does): missing, other cells, or not run."""
    path = HERE / name
    if not path.exists():
        return "not built"
    notebook = nbformat.read(path, as_version=4)
    if content(notebook) != content(build(name)):
        return "its cells differ from its source"
    if any(cell.cell_type == "code" and cell.execution_count is None for cell in notebook.cells):
        return "saved without its outputs"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="notebooks to build, as 02_rope (default: all)")
    parser.add_argument("--check", action="store_true", help="compare instead of building; exit 1 if one is stale")
    args = parser.parse_args(argv)
    names = [name.removesuffix(".ipynb") + ".ipynb" for name in args.names] or NOTEBOOKS
    unknown = sorted(set(names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"no source for {', '.join(unknown)} in {SOURCES.name}/")
    if args.check:
        stale = {name: reason for name in names if (reason := stale_reason(name))}
        for name, reason in stale.items():
            print(
                f"{name}: {reason}; run python notebooks/build_notebooks.py {name.removesuffix('.ipynb')}",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for name in names:
        print(f"running notebooks/{name} ...", file=sys.stderr, flush=True)
        nbformat.write(execute(build(name)), HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
