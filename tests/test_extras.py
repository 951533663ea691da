"""What a cluster installs: the wheel's required dependencies are what the package's core imports; the demo's model
(scikit-learn) and the notebooks' plots and widgets (matplotlib, ipywidgets) come with extras, and without them the
demo's model says which extra to install. No Spark."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRA_ONLY = {"sklearn": "scikit-learn", "matplotlib": "matplotlib", "ipywidgets": "ipywidgets"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_required_dependencies_leave_the_demo_and_notebook_packages_to_extras() -> None:
    required = {_name(r) for r in PROJECT["dependencies"]}
    assert not required & set(EXTRA_ONLY.values()), required
    extras = PROJECT["optional-dependencies"]
    assert "scikit-learn" in {_name(r) for r in extras["demo"]}
    notebooks = {_name(r) for r in extras["notebooks"]}
    assert {"matplotlib", "ipywidgets", "windowed-features"} <= notebooks and "demo" in extras["notebooks"][0]
    assert PROJECT["name"] == "windowed-features"


def test_only_the_demo_imports_what_the_extras_bring() -> None:
    core = {
        path.relative_to(ROOT).as_posix(): _top_level_imports(path) & set(EXTRA_ONLY)
        for path in (ROOT / "features").rglob("*.py")
        if "demo" not in path.relative_to(ROOT / "features").parts
    }
    assert not {module: found for module, found in core.items() if found}


def test_the_demo_model_without_scikit_learn_names_the_extra() -> None:
    # An interpreter in which scikit-learn cannot be imported, as in an install without the `demo` extra.
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "from features.demo.train import classifier\n"
        "from features.errors import EnvironmentProblem\n"
        "try:\n    classifier()\nexcept EnvironmentProblem as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert "the demo's model needs scikit-learn" in out.stdout
    assert "Fix: `pip install 'windowed-features[demo]'`" in out.stdout, out.stdout + out.stderr
