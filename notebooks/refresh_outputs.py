"""Run every notebook here top to bottom and store its outputs in the .ipynb, so that a reader on a code host sees
what each cell shows:

    python notebooks/refresh_outputs.py            # every notebook, in name order
    python notebooks/refresh_outputs.py 05_change_a_definition.ipynb

The notebooks run as tests/test_notebooks.py runs them (which CI does on every change, writing nothing back): in
name order, in one temporary copy of the example repository (no data, no MLflow store) and of the notebooks,
each with a Jupyter kernel of this interpreter (nbclient), without MLFLOW_* or Databricks variables. So the
checkout's own `feature_repo/data` is never touched. Then each stored notebook gets the outputs and execution
counts of its run (its cells' sources must be the ones that ran), with what would differ from run to run or
machine to machine taken out:

- paths: the temporary checkout and this checkout become `<checkout>`, this interpreter's prefix `<venv>` (its
  base `<python>`), the home folder `~`; any other absolute path under /tmp, /work, /root or /home `<path>`;
- ids: MLflow run ids and validation run ids become `<run id>`; times of the day the notebooks ran (a run's
  start, a completed partition, log lines, Feast's object timestamps) `<time>`; the port a served model listens
  on `<port>`;
- a stream output left blank (by a progress bar that closed) is dropped;
- widgets: a Jupyter widget (tqdm's bar when ipywidgets is installed) keeps only its text form, and the
  notebook no widget state.

Every notebook starts Spark: run this when no other Spark job runs on the machine. It takes several minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CELL_TIMEOUT_S = 1200
# What a fresh checkout has: the example repository without data, and the notebooks without their scratch.
IGNORED = shutil.ignore_patterns("data", ".features", "__pycache__", ".ipynb_checkpoints", "scratch")
WIDGET = "application/vnd.jupyter.widget-view+json"
CLEARED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "DATABRICKS_RUNTIME_VERSION")

MLFLOW_RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")
VALIDATION_RUN_ID = re.compile(r"\b\d{8}T\d{6,12}Z-[0-9a-f]{6}\b")  # features.quality.new_run_id
COMPACT_TIME = re.compile(r"\b\d{8}T\d{6}(?:\.\d+)?Z\b")  # Great Expectations' run time in Data Docs paths
LOCAL_PORT = re.compile(r"(127\.0\.0\.1|localhost):\d{2,5}")
# The times in the objects `feast apply` prints when it updates them (Feast's protobuf text)
FEAST_TIME = re.compile(r"(_timestamp \{\s*seconds: )\d+(\s*nanos: )\d+")
OTHER_PATH = re.compile(r"(?<![\w.<>~-])/(?:tmp|work|root|home)/[^\s'\"<>`)\],;]*")


def notebooks(names: Iterable[str]) -> list[str]:
    everything = sorted(p.name for p in HERE.glob("*.ipynb"))
    chosen = list(names) or everything
    unknown = [n for n in chosen if n not in everything]
    if unknown:
        raise SystemExit(f"no notebook {', '.join(unknown)} in {HERE}; there are {', '.join(everything)}")
    return chosen


def fresh_checkout(parent: Path) -> Path:
    """The parts of a fresh checkout the notebooks read: the example repo (no data) and the notebooks."""
    root = parent / "checkout"
    shutil.copytree(ROOT / "feature_repo", root / "feature_repo", ignore=IGNORED)
    shutil.copytree(HERE, root / "notebooks", ignore=IGNORED)
    return root


def execute(path: Path) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in its folder; raises CellExecutionError, with the cell, on any cell error."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        coalesce_streams=True,  # one stream per cell, progress bars' carriage returns applied
        record_timing=False,
    )
    client.execute()
    return notebook


def scrubber(checkout: Path, began: datetime) -> Callable[[str], str]:
    """A function that takes the volatile and machine-specific parts out of an output's text."""
    paths = {str(checkout): "<checkout>", str(checkout.resolve()): "<checkout>", str(ROOT): "<checkout>"}
    paths |= {sys.prefix: "<venv>", sys.base_prefix: "<python>", str(Path.home()): "~"}
    ordered = sorted(paths.items(), key=lambda item: len(item[0]), reverse=True)  # the longest (innermost) first
    days = {began.date() + timedelta(days=n) for n in range((datetime.now(UTC).date() - began.date()).days + 1)}
    days |= {d - timedelta(days=1) for d in days} | {d + timedelta(days=1) for d in days}  # local time vs UTC
    # ISO days, and the 2026/01/31 of MLflow's log lines and the 26/01/31 of Spark's
    spelled = [f"{d:%Y-%m-%d}|{d:%Y/%m/%d}|{d:%y/%m/%d}" for d in sorted(days)]
    run_times = re.compile(rf"\b(?:{'|'.join(spelled)})[ T]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d| UTC)?")

    def scrub(text: str) -> str:
        for old, new in ordered:
            text = text.replace(old, new)
        text = VALIDATION_RUN_ID.sub("<run id>", text)
        text = MLFLOW_RUN_ID.sub("<run id>", text)
        text = COMPACT_TIME.sub("<time>", text)
        text = run_times.sub("<time>", text)
        text = LOCAL_PORT.sub(r"\1:<port>", text)
        text = FEAST_TIME.sub(r"\1<time>\2<time>", text)
        return OTHER_PATH.sub("<path>", text)

    return scrub


def stored_outputs(outputs: list[nbformat.NotebookNode], scrub: Callable[[str], str]) -> list[nbformat.NotebookNode]:
    kept = []
    for output in outputs:
        if "text" in output:
            output["text"] = scrub(output["text"])
            if output.get("output_type") == "stream" and not output["text"].strip():
                continue  # what a closed progress bar leaves: blanks
        if "traceback" in output:
            output["traceback"] = [scrub(line) for line in output["traceback"]]
        if "evalue" in output:
            output["evalue"] = scrub(output["evalue"])
        data = output.get("data")
        if data is not None:
            data.pop(WIDGET, None)
            for mime, value in list(data.items()):
                if mime.startswith("text/") or mime in ("application/json", "image/svg+xml"):
                    data[mime] = scrub(value if isinstance(value, str) else "".join(value))
            if not data:
                continue  # a widget without a text form
        kept.append(output)
    return kept


def store(executed: nbformat.NotebookNode, target: Path, scrub: Callable[[str], str]) -> int:
    """Put the executed notebook's outputs into the stored notebook at `target`; returns the outputs stored."""
    stored = nbformat.read(target, as_version=4)
    if [c.source for c in stored.cells] != [c.source for c in executed.cells]:
        raise SystemExit(f"{target.name} changed while it ran; run this script again")
    count = 0
    for cell, ran in zip(stored.cells, executed.cells, strict=True):
        if cell.cell_type != "code":
            continue
        cell.outputs = stored_outputs(ran.outputs, scrub)
        cell.execution_count = ran.execution_count
        cell.metadata.pop("execution", None)
        count += len(cell.outputs)
    stored.metadata.pop("widgets", None)
    nbformat.validate(stored)
    nbformat.write(stored, target)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: every notebook here)")
    names = notebooks(parser.parse_args(argv).names)
    for variable in CLEARED_ENV:
        os.environ.pop(variable, None)  # the kernels inherit this environment
    began = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="notebooks-") as scratch:
        checkout = fresh_checkout(Path(scratch))
        executed = {}
        for name in names:
            print(f"running {name}", flush=True)
            executed[name] = execute(checkout / "notebooks" / name)
        scrub = scrubber(checkout, began)
        for name, notebook in executed.items():
            print(f"{name}: {store(notebook, HERE / name, scrub)} outputs stored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
