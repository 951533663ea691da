"""Progress bars show where someone watches (features.progress): on a terminal and in a Jupyter kernel, where
stderr is never a terminal; a plain process whose stderr is a pipe or a file (a job, a CI log) gets none.

Each case runs the same few lines for real: in a child process with stderr on a pipe, then on a
pseudo-terminal, and in a Jupyter kernel of this interpreter (nbclient). No Spark.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import nbformat
from kernels import ipc_config
from nbclient import NotebookClient

SCRIPT = """\
from features.progress import PartitionProgress, shown_by_default

print("shown:", shown_by_default())
with PartitionProgress(3, "backfill") as bar:
    bar.advance(1, 1_000)
    bar.advance(2, 234)
print("rows:", bar.rows)
"""


def test_no_bar_when_stderr_is_a_pipe() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    assert "shown: False" in done.stdout and "rows: 1234" in done.stdout
    assert done.stderr == ""


def test_a_bar_on_a_terminal() -> None:
    controller, terminal = pty.openpty()
    # A terminal of 24 rows and 120 columns (a new pseudo-terminal has none, and tqdm fits the bar to its width)
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed: the child is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    assert "shown: True" in out
    final = shown.decode().split("\r")[-2]  # the last redraw before the bar's closing newline
    assert "3/3" in final and "1,234 rows" in final, shown


def test_a_bar_in_a_jupyter_kernel(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SCRIPT)])
    NotebookClient(notebook, timeout=120, kernel_name="python3", config=ipc_config(tmp_path)).execute()
    outputs = notebook.cells[0].outputs
    stdout = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "shown: True" in stdout and "rows: 1234" in stdout
    if importlib.util.find_spec("ipywidgets") is None:
        # tqdm.auto's text bar on the kernel's stderr, without its warning that widgets are missing
        assert "3/3" in stderr and "1,234 rows" in stderr, stderr
        assert "IProgress" not in stderr
    else:
        widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert widgets, outputs


NESTED = """\
from features.progress import PartitionProgress, spark_progress

with PartitionProgress(1, "schedule") as outer:
    with spark_progress(None, "tasks beneath"):  # shows nothing, so it never asks the (absent) session
        pass
    outer.advance(1, 7)
"""


def test_a_notebooks_text_output_shows_one_bar_at_a_time(tmp_path: Path) -> None:
    """Text in a notebook cannot move the cursor back up to the outer bar: a Spark-task bar would print a new
    line at every redraw, so beneath a schedule's bar it stays off (widgets, with ipywidgets, do stack)."""
    # A Jupyter without ipywidgets (the notebooks extra brings it; a bare Jupyter does not): text bars.
    without_widgets = "import sys\nsys.modules['ipywidgets'] = None  # its import fails, as when not installed\n"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(without_widgets + NESTED)])
    NotebookClient(notebook, timeout=120, kernel_name="python3", config=ipc_config(tmp_path)).execute()
    stderr = "".join(o.get("text", "") for o in notebook.cells[0].outputs if o.get("name") == "stderr")
    assert "schedule" in stderr and "1/1" in stderr and "7 rows" in stderr, stderr
    assert "tasks beneath" not in stderr
