"""Set-up time of a fresh checkout, as a new user meets it: `./dev setup` (a virtualenv, the package installed
with its `local` and `dev` extras, the Java check) in a fresh `git clone`, a whole process, with empty caches, so
that everything is downloaded, built and installed as on a new machine.

    python bench/install.py [--rounds 2] [--ref HEAD] [--no-save]
    python bench/install.py --demo [--rounds 2] [--ref HEAD] [--no-save]

Default: the set-up with pip forced (FEATURES_INSTALLER=pip, the baseline, what `./dev` did before) against the
set-up with uv (`./dev`'s default), the order alternating by round; each run gets its own clone and its own empty
PIP_CACHE_DIR, UV_CACHE_DIR and XDG_CACHE_HOME. Prints each time, the medians and the ratio uv / pip, and checks
that both installed the same versions.
--demo: the whole first `./dev demo` (uv's install, then the demo: Spark starts, fetches its Java packages into the
empty cache, runs) in a fresh clone with empty caches (required: <= 90 s on 2 cores). It runs Spark: run it under
the machine's Spark lock when others share the machine.
The runs get the caller's environment without its virtualenv (VIRTUAL_ENV, and PATH without the virtualenv's
folder) and without the project's, MLflow's and Spark's variables (FEATURES_*, MLFLOW_*, PYSPARK_*, SPARK_*).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from results import load, update_section  # noqa: E402 - bench/ on the path first

INSTALLERS = ("pip", "uv")
FELL_BACK = "installing with pip instead"  # ./dev's note when uv could not install: that run measured pip
REQUIRED_DEMO = 90.0  # seconds, the whole first `./dev demo` on 2 cores (issue 64)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def clone(commit: str, into: Path) -> Path:
    """A fresh clone of this checkout's `commit`: its committed files only, as `git clone` gives a new user."""
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(into)], check=True)
    git("checkout", "--quiet", "--detach", commit, cwd=into)
    return into


def user_path() -> str:
    """PATH without the virtualenv this benchmark may run in (the checkout's .venv): a new user has none, and its
    uv or python3 would otherwise stand in for the machine's."""
    venvs = {(ROOT / ".venv").resolve()}
    if sys.prefix != sys.base_prefix:
        venvs.add(Path(sys.prefix).resolve())
    kept = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not any(Path(entry).resolve().is_relative_to(venv) for venv in venvs)
    ]
    return os.pathsep.join(kept)


def run_env(caches: Path, installer: str | None) -> dict[str, str]:
    """The environment of one run: the caller's, as a new user's shell, with empty caches of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "VIRTUAL_ENV" and not k.startswith(("FEATURES_", "MLFLOW_", "PYSPARK_", "SPARK_"))
    }
    env["PATH"] = user_path()
    for name, folder in (("PIP_CACHE_DIR", "pip"), ("UV_CACHE_DIR", "uv"), ("XDG_CACHE_HOME", "xdg")):
        env[name] = str(caches / folder)
        (caches / folder).mkdir(parents=True)
    if installer == "pip":
        env["FEATURES_INSTALLER"] = "pip"
    # Line by line as it happens, so that the demo's output tells where the set-up ended.
    env["PYTHONUNBUFFERED"] = "1"
    return env


def timed_dev(checkout: Path, env: dict[str, str], *args: str) -> tuple[float, list[tuple[float, str]]]:
    """Wall seconds of `./dev args` as one process, and its output lines (stdout and stderr) with the seconds at
    which each came; stops the benchmark if it fails or if uv fell back to pip."""
    began = time.perf_counter()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        ["./dev", *args], cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.perf_counter() - began, line.rstrip("\n")))
    wall = time.perf_counter() - began
    output = "\n".join(line for _, line in lines)
    if process.returncode != 0:
        raise SystemExit(f"./dev {' '.join(args)} failed ({process.returncode}) in {checkout}:\n{output}")
    if FELL_BACK in output and env.get("FEATURES_INSTALLER") != "pip":
        raise SystemExit(f"./dev {' '.join(args)} fell back to pip, so it timed no uv install:\n{output}")
    return wall, lines


def installed(checkout: Path) -> dict[str, str]:
    """The distributions in the clone's .venv and their versions (pip's names, normalized), uv itself left out:
    only the uv runs install it."""
    python = str(checkout / ".venv" / "bin" / "python")
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    versions = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(listed)}
    versions.pop("uv", None)
    return versions


def one_run(commit: str, installer: str | None, *args: str) -> tuple[float, list[tuple[float, str]], dict[str, str]]:
    """`./dev args` in a fresh clone with empty caches: its seconds, its output lines and what it installed."""
    with tempfile.TemporaryDirectory(prefix="bench-install-") as scratch:
        checkout = clone(commit, Path(scratch) / "checkout")
        env = run_env(Path(scratch) / "caches", installer)
        wall, lines = timed_dev(checkout, env, *args)
        return wall, lines, installed(checkout)


def listed(walls: list[float]) -> str:
    return " / ".join(f"{w:.1f}" for w in walls)


def differences(pip: dict[str, str], uv: dict[str, str]) -> list[str]:
    return [
        f"{name} {pip.get(name, '-')} (pip) / {uv.get(name, '-')} (uv)"
        for name in sorted(pip.keys() | uv.keys())
        if pip.get(name) != uv.get(name)
    ]


def uv_source() -> str:
    found = shutil.which("uv", path=user_path())
    if found:
        return f"the uv on PATH ({found})"
    return "no uv on PATH, so the uv runs include `./dev`'s `pip install uv` into .venv"


def installs(args: argparse.Namespace, commit: str) -> tuple[list[str], bool]:
    walls: dict[str, list[float]] = {name: [] for name in INSTALLERS}
    versions: dict[str, dict[str, str]] = {}
    for round_ in range(args.rounds):
        for installer in INSTALLERS if round_ % 2 == 0 else INSTALLERS[::-1]:
            wall, _, versions[installer] = one_run(commit, installer, "setup")
            walls[installer].append(wall)
            print(f"round {round_ + 1}: {installer} {wall:.1f} s", flush=True)
    pip, uv = statistics.median(walls["pip"]), statistics.median(walls["uv"])
    ratios = [u / p for u, p in zip(walls["uv"], walls["pip"], strict=True)]
    ratio = statistics.median(ratios)
    differ = differences(versions["pip"], versions["uv"])
    same = (
        f"the same {len(versions['pip'])} distributions at the same versions"
        if not differ
        else f"{len(differ)} differ: " + "; ".join(differ)
    )
    lines = [
        f"`python bench/install.py --rounds {args.rounds}`: `./dev setup` (creates .venv, installs the package "
        "editable with its `local` and `dev` extras, checks Java) in a fresh `git clone` of "
        f"{git('rev-parse', '--short', commit)}, a whole process, with empty caches (new PIP_CACHE_DIR, "
        "UV_CACHE_DIR and XDG_CACHE_HOME: every package downloaded, PySpark's source distribution built); pip "
        "forced (`FEATURES_INSTALLER=pip`, the baseline: `./dev` before uv) against uv (`./dev`'s default; "
        f"{uv_source()}), alternating by round. pip compiles every module to bytecode as it installs; uv "
        "leaves that to the first imports. Medians; every run listed.",
        "",
        "| installer | seconds (median) | runs |",
        "|---|---|---|",
        f"| pip (`FEATURES_INSTALLER=pip`) | {pip:.1f} | {listed(walls['pip'])} |",
        f"| uv | {uv:.1f} | {listed(walls['uv'])} |",
        "",
        f"Ratio uv / pip, the median of the rounds' ratios ({' / '.join(f'{r:.2f}' for r in ratios)}): "
        f"**{ratio:.2f}x** (pip takes {1 / ratio:.1f}x as long). Installed: {same}.",
    ]
    return lines, True


def demo(args: argparse.Namespace, commit: str) -> tuple[list[str], bool]:
    walls, setups = [], []
    for round_ in range(args.rounds):
        wall, lines, _ = one_run(commit, None, "demo")
        # The demo's first step line ends the set-up (./dev's `==>` lines, the install, the Java check).
        first_step = next((at for at, line in lines if line.startswith("[1/")), None)
        walls.append(wall)
        setups.append(first_step)
        print(f"round {round_ + 1}: ./dev demo {wall:.1f} s (set-up {first_step or float('nan'):.1f} s)", flush=True)
    median = statistics.median(walls)
    known = [s for s in setups if s is not None]
    split = (
        f" Of that, the set-up (uv's install and the Java check, until the demo's first step printed): "
        f"{listed(known)} s; the demo itself: {listed([w - s for w, s in zip(walls, setups, strict=True) if s])} s."
        if known
        else ""
    )
    lines = [
        f"`python bench/install.py --demo --rounds {args.rounds}`: the whole first `./dev demo` in a fresh `git clone` "
        f"of {git('rev-parse', '--short', commit)}, a whole process, with empty caches (new PIP_CACHE_DIR, "
        "UV_CACHE_DIR and XDG_CACHE_HOME: every package downloaded and installed by uv, Spark's Java packages "
        "fetched; the demo leaves the JVM class archive to the next command); "
        f"{uv_source()}. Each round a new clone and new caches.",
        "",
        f"Runs: {listed(walls)} s; median **{median:.1f} s** (required <= {REQUIRED_DEMO:g} s on 2 cores).{split}",
    ]
    return lines, median <= REQUIRED_DEMO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ref", default="HEAD", help="the commit of this checkout to clone (committed files only)")
    parser.add_argument("--demo", action="store_true", help="time the whole first `./dev demo` (runs Spark)")
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    commit = git("rev-parse", args.ref)
    began = datetime.now(UTC)
    load_before = load()
    text, met = (demo if args.demo else installs)(args, commit)
    lines = [
        f"Run on {began:%Y-%m-%d}; {load_before} at the start.",
        "",
        *text,
        "",
        f"{load()} at the end; {os.cpu_count()} cores.",
    ]
    print("\n".join(lines))
    if not args.no_save:
        title = "First `./dev demo` (bench/install.py --demo)" if args.demo else "Set-up time (bench/install.py)"
        update_section(title, "\n".join(lines))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
