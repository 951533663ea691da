"""Every notebook in notebooks/ runs top to bottom, as on a fresh checkout, with a Jupyter kernel of this
interpreter (nbclient). Any cell error fails the test.

They run in name order in one temporary copy of the checkout's example repository and notebooks (no data,
no MLflow store): 01 explores, 02 backfills and registers a model, a later notebook (e.g. 04 serving) uses
what the earlier ones left, as a user working through them would. They share one kernel, each in a fresh
namespace, as notebooks on one Databricks cluster share its Spark driver. Each also runs on its own, in a
kernel of its own (04 builds the model when it finds none). The executed notebooks are kept in the test's
temporary folder for inspection; the checked-in ones are never written here.

The checked-in notebooks carry the outputs of a real run, stored by `notebooks/refresh_outputs.py` (which runs
them the same way): every cell that shows something has them, without the machine's paths.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from jupyter_client.manager import KernelManager
from kernels import ipc
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
    "05_change_a_definition.ipynb": [
        # 2026-01-03 waits for data past its end: the demo's data stops within that day
        "user_transactions: 2 partitions to compute: 2026-01-01..2026-01-02 (definition changed: added feature "
        "'declined_count_1h')",
        "user_transactions: waiting for data: the source ends 2026-01-03 23:",
        "card_merchant: up to date",
        "declined_count_1h",
        "failed validation",
        "no transaction over 500 in a day",
        "data_docs/local_site/index.html",
    ],
    "06_request_features.ipynb": [
        "its parameter 'tip' is no request field or stored feature",
        "amount_share_1h",
        "held-out ROC AUC",
        "fraud_probability",
        "seconds_since_card_txn",
    ],
}
IGNORED = shutil.ignore_patterns("data", ".features", "__pycache__", ".ipynb_checkpoints", "scratch")
MACHINE_PATHS = ("/work/", "/tmp/", "/root/", "/home/", "/Users/", "C:\\", str(ROOT), str(Path.home()) + "/")


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


def code_of(cell: nbformat.NotebookNode) -> str:
    """A code cell's source as Python: IPython's syntax (`%pip ...`) turned into the calls it stands for."""
    return TransformerManager().transform_cell(cell.source)


def test_every_notebook_is_found():
    assert {
        "01_define_and_explore.ipynb",
        "02_backfill_and_train.ipynb",
        "03_streaming.ipynb",
        "04_serving.ipynb",
        "05_change_a_definition.ipynb",
        "06_request_features.ipynb",
    } == set(NOTEBOOKS)


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


def documented_modules() -> set[str]:
    """The top-level package and the modules docs/python-api.md lists as public ("Public modules", up to
    "Everything else ... is internal"). Read from the page rather than listed here, so that a module a notebook
    needs is made public where users read it, not only in this test."""
    page = (ROOT / "docs" / "python-api.md").read_text()
    section = page.split("\n## Public modules\n", 1)[1].split("\n## ", 1)[0]
    listed = section.split("Everything else", 1)[0]
    return {"features"} | set(re.findall(r"`(features(?:\.[a-z_]+)+)`", listed))


# What notebooks may import: never the internals (engines, repo, CLI), which change without notice.
PUBLIC_MODULES = documented_modules()


def imported_modules(notebook: nbformat.NotebookNode) -> set[str]:
    """Every module a notebook's code cells import (`import x`, `from x import y`: x, or x.y when that is a
    module of the package)."""
    modules: set[str] = set()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(code_of(cell))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                submodules = [n for n in names if n.startswith("features.") and _is_module(n)]
                modules.update(submodules or [node.module])
            elif isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
    return modules


def _is_module(name: str) -> bool:
    parent = importlib.import_module(name.rpartition(".")[0])
    return hasattr(parent, "__path__") and importlib.util.find_spec(name) is not None


def internal_imports(notebook: nbformat.NotebookNode) -> set[str]:
    return {m for m in imported_modules(notebook) if m.split(".")[0] == "features" and m not in PUBLIC_MODULES}


def test_the_public_modules_are_read_from_the_docs_and_exist():
    assert {"features", "features.pipelines.backfill", "features.quality", "features.ml.model"} <= PUBLIC_MODULES
    assert "features.engine" not in PUBLIC_MODULES and "features.backfill" not in PUBLIC_MODULES
    missing = [m for m in sorted(PUBLIC_MODULES) if importlib.util.find_spec(m) is None]
    assert not missing, f"docs/python-api.md lists modules that do not exist: {missing}"


def test_an_import_of_an_internal_module_is_caught():
    cell = nbformat.v4.new_code_cell(
        "import features\nfrom features.engine import session\nfrom features.pipelines.schedule_plan import plan\n"
        "import features.repo\nfrom features.ml import tracking\n%time features.load_repo()"
    )
    notebook = nbformat.v4.new_notebook(cells=[cell])
    expected = {"features.engine.session", "features.pipelines.schedule_plan", "features.repo"}
    assert internal_imports(notebook) == expected


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_call_only_the_public_api(name: str) -> None:
    internal = internal_imports(nbformat.read(ROOT / "notebooks" / name, as_version=4))
    assert not internal, (
        f"{name} imports internal modules {sorted(internal)}: use the top-level `features` API or a module "
        "docs/python-api.md lists as public (make it public there first)"
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_have_a_databricks_setup_cell(name: str) -> None:
    """Right after the parameters: on Databricks, %pip install the wheel and the repo path from widgets; a
    no-op elsewhere (the notebook runs below without DATABRICKS_RUNTIME_VERSION, so CI executes it)."""
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    setup = [c for c in code if "DATABRICKS_RUNTIME_VERSION" in c.source]
    assert len(setup) == 1, f"{name}: no Databricks set-up cell"
    first = code.index(setup[0])
    assert "parameters" in code[first - 1].metadata.get("tags", []), f"{name}: the set-up cell follows the parameters"
    source = setup[0].source
    for wanted in ('if os.environ.get("DATABRICKS_RUNTIME_VERSION"):', "%pip install", 'dbutils.widgets.get("repo")'):
        assert wanted in source, f"{name}: the Databricks set-up cell lacks {wanted!r}"
    before = "\n".join(c.source for c in code[:first])
    assert "import features" not in before and "from features" not in before, f"{name}: install before importing"
    markdown = notebook.cells[notebook.cells.index(setup[0]) - 1]
    assert markdown.cell_type == "markdown" and "Databricks" in markdown.source, f"{name}: say what the cell does"


def shows_something(cell: nbformat.NotebookNode) -> bool:
    """A code cell that shows something when it runs: it prints, displays or plots, or ends with an expression."""
    tree = ast.parse(code_of(cell))
    shown = {"print", "display", "show", "printSchema"}
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    return bool(calls & shown) or bool(tree.body and isinstance(tree.body[-1], ast.Expr))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_outputs_show_every_cell_without_machine_paths(name: str) -> None:
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    silent = [i for i, c in enumerate(code) if shows_something(c) and not c.outputs]
    assert not silent, f"{name}: code cells {silent} show something but have no stored outputs; run refresh_outputs.py"
    errors = [i for i, c in enumerate(code) if any(o.output_type == "error" for o in c.outputs)]
    assert not errors, f"{name}: code cells {errors} stored an error"
    stored = outputs_text(notebook)
    leaked = [path for path in MACHINE_PATHS if path in stored]
    assert not leaked, f"{name}: stored outputs mention {leaked}; run refresh_outputs.py, which takes them out"
    assert "application/vnd.jupyter.widget-view+json" not in stored, f"{name}: a widget has no state stored"
    # The notebooks' extra brings ipywidgets: Jupyter shows progress widgets, and tqdm has nothing to warn about.
    assert "TqdmWarning" not in stored and "IProgress not found" not in stored, f"{name}: run refresh_outputs.py"


@pytest.fixture(scope="module")
def kernel(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelManager]:
    """One Jupyter kernel for the notebooks, run in order, each in a namespace of its own: as notebooks attached
    to one Databricks cluster share its Spark driver, the Spark session one starts is the next one's (and a JVM
    start per notebook is spared). The kernel gets this environment but the repository's own MLflow store and no
    Databricks."""
    hidden = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "DATABRICKS_RUNTIME_VERSION")
    manager = KernelManager(kernel_name="python3", **ipc(tmp_path_factory.mktemp("kernel")))
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    manager.start_kernel(cwd=str(checkout / "notebooks"), env=env)
    yield manager
    manager.shutdown_kernel(now=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name: str, checkout: Path, kernel: KernelManager, tmp_path: Path):
    folder = checkout / "notebooks"
    notebook = nbformat.read(folder / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []  # what the test checks comes from this run, not from the stored outputs
    notebook.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))  # the previous notebook's names go
    client = NotebookClient(notebook, km=kernel, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on any cell error
    finally:
        nbformat.write(notebook, tmp_path / name)
    text = outputs_text(notebook)
    for wanted in SHOWS.get(name, []):
        assert wanted in text, f"{name}: its outputs do not show {wanted!r} (executed copy: {tmp_path / name})"
