"""notebooks/quickstart.ipynb runs top to bottom on CPU (tiny:runlocal, the session's shared bootstrap)."""

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_notebook_runs_top_to_bottom(tmp_path, tiny_bootstrap_cache, monkeypatch):
    workdir = tmp_path / "quickstart"
    workdir.mkdir()
    (workdir / "bootstrap").symlink_to(tiny_bootstrap_cache, target_is_directory=True)
    monkeypatch.setenv("SPADE_NOTEBOOK_PRESET_ARG", "runlocal")
    monkeypatch.setenv("SPADE_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()

    outputs = {}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            outputs[cell.source.splitlines()[0]] = text
    printed = "\n".join(outputs.values())
    assert "configs/tiny.py runlocal" in printed
    assert "admitted=" in printed and "isolation in force" in printed
    assert "regret" in printed and "designer reward" in printed
    assert "'loss'" in printed and "'grad_norm'" in printed
