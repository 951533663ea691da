"""Every notebook in notebooks/ runs top to bottom, as on a fresh checkout, with a Jupyter kernel of this
interpreter (nbclient). Any cell error fails the test.

They run in name order in one temporary copy of the checkout's example repository and notebooks (no data,
no MLflow store): 01 explores, 02 backfills and registers a model, a later notebook (e.g. 04 serving) uses
what the earlier ones left, as a user working through them would. Each also runs on its own (04 builds the
model when it finds none). The executed notebooks are kept in the test's temporary folder for inspection.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 1200
# What a notebook must show besides running without error: an image (a plot), or text in its outputs.
SHOWS: dict[str, list[str]] = {
    "01_define_and_explore.ipynb": ["image/png", "same as the repository's definition: True"],
    "02_backfill_and_train.ipynb": ["image/png", "held-out ROC AUC", "amount + windowed features", "registered"],
    "03_streaming.ipynb": ["failed_count_24h", "freshness_seconds", "stream stopped: True"],
    "04_serving.ipynb": ["fraud_probability", "mlflow models serve listens on http://127.0.0.1:"],
}
IGNORED = shutil.ignore_patterns("data", ".features", "__pycache__", ".ipynb_checkpoints")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parts of a fresh checkout the notebooks read: the example repo (no data) and the notebooks."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "feature_repo", root / "feature_repo", ignore=IGNORED)
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=IGNORED)
    return root


def outputs_text(notebook: nbformat.NotebookNode) -> str:
    """Every output of every cell as text: streams, results, errors, and the MIME types of rich outputs."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            for mime, value in output.get("data", {}).items():
                parts.append(mime)
                if mime.startswith("text/"):
                    parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def test_every_notebook_is_found():
    assert {
        "01_define_and_explore.ipynb",
        "02_backfill_and_train.ipynb",
        "03_streaming.ipynb",
        "04_serving.ipynb",
    } <= set(NOTEBOOKS)


def test_notebooks_have_a_parameters_cell_and_no_machine_paths():
    for name in NOTEBOOKS:
        notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
        assert tagged, f"{name}: no cell tagged 'parameters'"
        assert code.index(tagged[0]) <= 1, f"{name}: the parameters cell should come first"
        source = "\n".join(c.source for c in notebook.cells)
        for machine_path in ("/work/", "/tmp/", "/home/", "/Users/", "C:\\"):
            assert machine_path not in source, f"{name}: mentions {machine_path}"


# What notebooks may import: the top-level package and its documented modules, never the internals (engines,
# backfill, repo, CLI), which change without notice.
PUBLIC_MODULES = {"features", "features.demo", "features.demo.run", "features.model", "features.quality"}
PUBLIC_MODULES |= {"features.stream", "features.tracking"}


def imported_modules(notebook: nbformat.NotebookNode) -> set[str]:
    """Every module a notebook's code cells import (`import x`, `from x import y`)."""
    import ast

    modules: set[str] = set()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
    return modules


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_call_only_the_public_api(name: str) -> None:
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    internal = {m for m in imported_modules(notebook) if m.split(".")[0] == "features" and m not in PUBLIC_MODULES}
    assert not internal, f"{name} imports internal modules {sorted(internal)}: use the top-level `features` API"


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name: str, checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The kernel inherits this environment: the repository's own MLflow store, no Databricks.
    for variable in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "DATABRICKS_RUNTIME_VERSION"):
        monkeypatch.delenv(variable, raising=False)
    folder = checkout / "notebooks"
    notebook = nbformat.read(folder / name, as_version=4)
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on any cell error
    finally:
        nbformat.write(notebook, tmp_path / name)
    text = outputs_text(notebook)
    for wanted in SHOWS.get(name, []):
        assert wanted in text, f"{name}: its outputs do not show {wanted!r} (executed copy: {tmp_path / name})"
