"""What the docs and notebooks quote agrees with the code and with bench/RESULTS.md (no Spark): docs/commands.md's
summary lists every command with its flags; the Spark versions and Databricks runtimes named match
features/engine/runtime.py and the Spark releases features/engine/jars.py has packages for; the demo's time is
the one of bench/RESULTS.md's Cold start section, and a page citing a RESULTS.md section quotes its figures; the
package is installed by its distribution name. A figure or version copied into prose goes stale silently when
the code or a benchmark moves on; these tests make it fail instead."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import nbformat
import pytest
from test_docs import FLAG, PAGES, ROOT, as_command, flags_of, shell_lines, slug, split_code, subcommands

from features.engine import jars, runtime
from features.version import DISTRIBUTION, WHEEL_PREFIX

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DEPLOYMENT = ROOT / "docs" / "deployment.md"
RESULTS = ROOT / "bench" / "RESULTS.md"
# The benchmarks page keeps each benchmark's earlier runs, every one labelled with the commit it ran at.
HISTORY = ROOT / "docs" / "benchmarks.md"


def spark(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def flat(text: str) -> str:
    return " ".join(text.split())


@cache
def markdown_of(notebook: Path) -> str:
    return "\n\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "markdown")


@cache
def prose_texts() -> dict[str, str]:
    """Every page's and notebook's prose, by its path in the repository: markdown with the fenced blocks blanked,
    notebooks' markdown cells."""
    texts = {p.relative_to(ROOT).as_posix(): split_code(p.read_text())[0] for p in PAGES}
    texts |= {p.relative_to(ROOT).as_posix(): split_code(markdown_of(p))[0] for p in NOTEBOOKS}
    return texts


# ---------------------------------------------------------------------------------------------------------
# Commands


def test_the_commands_summary_lists_every_command_with_its_flags():
    _, blocks = split_code((ROOT / "docs" / "commands.md").read_text())
    summary: dict[str, set[str]] = {}
    for line in shell_lines(blocks[0]):  # the summary is the page's first code block
        text = flat(line)
        if text.startswith("features ") and text != "features --version":
            parsed = as_command(text)
            assert parsed is not None, text
            command, arguments = parsed
            summary[command] = set(FLAG.findall(arguments))
    missing = sorted(set(subcommands()) - set(summary))
    assert not missing, f"docs/commands.md's summary block lacks {missing}"
    assert set(summary) == set(subcommands()), sorted(set(summary) - set(subcommands()))
    wrong = [
        f"`features {command}`: the summary gives {sorted(flags)}, the parser has {sorted(parser_flags)}"
        for command, flags in summary.items()
        if flags != (parser_flags := flags_of(command) - {"--help"})
    ]
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------------------------------------
# Spark versions and Databricks runtimes

# A runtime named with its Spark: "18.x (Spark 4.1)", "`19.x-scala2.13` (Spark 4.2", "Runtime 19, Spark 4.2".
RUNTIME_SPARK = re.compile(
    r"\b(\d{2})(?:\.\d+)?\.x(?:-scala[\d.]+)?`?\s*\(Spark (\d+\.\d+)|\bRuntime (\d{2})\b[,;]?\s*\(?Spark (\d+\.\d+)"
)
RANGE = re.compile(r"\bSpark (\d+\.\d+) or newer(?:, below (\d+(?:\.\d+)?))?")


def runtimes_phrase() -> str:
    """The Databricks runtimes that work, as the docs name them (and as runtime.version_problem lists them)."""
    return " or ".join(
        f"{rt}.x (Spark {spark(runtime.DATABRICKS_RUNTIMES[rt])})" for rt in runtime.supported_runtimes()
    )


def local_phrase() -> str:
    """The PySpark a local session needs: the Spark releases features.engine.jars has Delta and Kafka packages for."""
    return "a local session needs PySpark " + " or ".join(spark(v) for v in sorted(jars.PACKAGES))


def texts_naming_versions() -> dict[str, str]:
    return prose_texts() | {"databricks.yml": (ROOT / "databricks.yml").read_text()}


def test_every_runtime_named_with_its_spark_has_that_spark():
    found, wrong = 0, []
    for name, text in texts_naming_versions().items():
        for match in RUNTIME_SPARK.finditer(flat(text)):
            major, version = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
            found += 1
            actual = runtime.DATABRICKS_RUNTIMES.get(int(major))
            if actual is None or spark(actual) != version:
                wrong.append(f"{name}: Databricks Runtime {major} with Spark {version}; runtime.py says {actual}")
    assert found >= 4, found  # the docs, the bundle and the notebooks name runtimes: the pattern still sees them
    assert not wrong, "\n".join(wrong)


def test_the_supported_range_quoted_is_runtime_py_s():
    quoted = [(name, m) for name, text in texts_naming_versions().items() for m in RANGE.finditer(flat(text))]
    assert any(name == "docs/deployment.md" for name, _ in quoted), "docs/deployment.md states the range"
    for name, match in quoted:
        assert runtime.parse_version(match.group(1)) == runtime.MIN_SPARK, f"{name}: {match.group(0)}"
        if match.group(2):
            assert runtime.parse_version(match.group(2) + ".0") == runtime.BELOW_SPARK, f"{name}: {match.group(0)}"


def test_deployment_names_the_runtimes_that_work_and_the_local_pyspark():
    text = flat(split_code(DEPLOYMENT.read_text())[0])
    assert f"Runtime {runtimes_phrase()}" in text
    assert local_phrase() in text


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_say_what_deployment_says_about_spark(notebook: Path):
    text = flat(markdown_of(notebook))
    assert f"Databricks Runtime {runtimes_phrase()}" in text, f"{notebook.name}: name the runtimes as deployment does"
    assert local_phrase() in text, f"{notebook.name}: say which PySpark a local session needs"
    allowed = {runtime.DATABRICKS_RUNTIMES[rt] for rt in runtime.supported_runtimes()} | set(jars.PACKAGES)
    named = {runtime.parse_version(v) for v in re.findall(r"\bSpark (\d+\.\d+)", text)}
    assert named <= allowed, f"{notebook.name} names Spark {sorted(named - allowed)}, which no supported set-up has"


# ---------------------------------------------------------------------------------------------------------
# Figures from bench/RESULTS.md

# The demo's time as pages quote it: "the demo (...) took 23.2 s", "The demo then took", "the demo 23.2 s".
DEMO_TIME = re.compile(
    r"(?:\bthe demo|`features demo`)(?:\s*\((?:[^()]|\([^()]*\))*\))?(?:\s+then)?\s+(?:took\s+)?(\d+(?:\.\d+)?) s\b",
    re.I,
)
# An abbreviated commit: 7 or more hex digits, at least one a digit (5223962 is one too).
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
SECONDS = re.compile(r"\b\d+\.\d+ s\b")
RESULTS_LINK = re.compile(r"\]\((?:\.\./)*bench/RESULTS\.md#([\w-]+)\)")


@cache
def results_sections() -> dict[str, str]:
    """bench/RESULTS.md's sections by their anchor."""
    parts = re.split(r"^## (.+)$", RESULTS.read_text(), flags=re.M)
    return {slug(heading): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


def cold_start() -> tuple[str, str]:
    """The demo's time in bench/RESULTS.md's Cold start section (bench/startup.py), and the commit it ran at."""
    section = results_sections()["cold-start-benchstartuppy"]
    demo = re.search(r"^\(c\) `features demo`.*?\*\*(\d+(?:\.\d+)?) s\*\*", section, flags=re.M)
    commit = re.search(r"^_Measured .* at commit ([0-9a-f]{7,40})\b", section, flags=re.M)
    assert demo is not None and commit is not None, "bench/RESULTS.md's Cold start section changed its format"
    return demo.group(1), commit.group(1)


def sentences(prose: str) -> list[str]:
    """The prose's sentences, whitespace normalized; a paragraph's end ends one too, and a heading is one."""
    chunks: list[str] = []
    for paragraph in re.split(r"\n\s*\n", prose):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if line.startswith("#"):
                chunks += ["\n".join(lines), line]
                lines = []
            else:
                lines.append(line)
        chunks.append("\n".join(lines))
    return [s for chunk in chunks for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`\[(*-])", flat(chunk)) if s]


def demo_quotes() -> list[tuple[str, str, str]]:
    """(page, figure, sentence) of every quote of the demo's time, but those of a run at another commit than
    RESULTS.md's (a page's history of earlier runs)."""
    _, commit = cold_start()
    quotes = []
    for name, prose in prose_texts().items():
        for sentence in sentences(prose):
            commits = set(COMMIT.findall(sentence))
            if commits and not any(commit.startswith(c) or c.startswith(commit) for c in commits):
                continue
            quotes += [(name, m.group(1), sentence) for m in DEMO_TIME.finditer(sentence)]
    return quotes


def test_the_demo_time_quoted_is_the_one_in_results():
    figure, _ = cold_start()
    quotes = demo_quotes()
    assert "docs/deployment.md" in {name for name, _, _ in quotes}, quotes  # the pattern still sees quotes
    wrong = [f"{name}: {quoted} s in {sentence!r}" for name, quoted, sentence in quotes if quoted != figure]
    assert not wrong, f"bench/RESULTS.md's Cold start section has the demo at {figure} s:\n" + "\n".join(wrong)


def test_history_is_told_apart_by_its_commit():
    assert sentences("## A heading\nThe demo took 9.9 s at abc1234. The demo\n9.8 s.\n\nA paragraph") == [
        "## A heading",
        "The demo took 9.9 s at abc1234.",
        "The demo 9.8 s.",
        "A paragraph",
    ]
    assert [m.group(1) for m in DEMO_TIME.finditer("the demo (200 events (x)) took 1.5 s; `features demo` 2 s")] == [
        "1.5",
        "2",
    ]
    assert COMMIT.findall("at 07cde80, a823aa5 and 5223962, not 2026-12-06, 1,976,743 or defaced") == [
        "07cde80",
        "a823aa5",
        "5223962",
    ]


def test_pages_citing_a_results_section_quote_its_figures():
    """A paragraph that links sections of bench/RESULTS.md quotes seconds from them (the benchmarks page aside,
    whose paragraphs are earlier runs)."""
    cited, wrong = 0, []
    for name, prose in prose_texts().items():
        if name == HISTORY.relative_to(ROOT).as_posix():
            continue
        for paragraph in re.split(r"\n\s*\n", prose):
            anchors = RESULTS_LINK.findall(paragraph)
            cited += len(anchors)
            sections = [results_sections().get(anchor) for anchor in anchors]
            wrong += [
                f"{name}: links bench/RESULTS.md#{anchor}, which has no such section"
                for anchor, section in zip(anchors, sections, strict=True)
                if section is None
            ]
            quoted = " ".join(flat(section) for section in sections if section is not None)
            missing = [s for s in SECONDS.findall(flat(paragraph)) if anchors and s not in quoted]
            if missing:
                wrong.append(f"{name}: {missing} are not in bench/RESULTS.md#{', #'.join(anchors)}")
    assert cited >= 1, "docs/deployment.md cites the Cold start section"
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------------------------------------
# The distribution name

PIP_INSTALL = re.compile(r"pip install((?:[ \t]+(?!#)[^\s`]+)+)")


def install_texts() -> dict[str, str]:
    texts = {p.relative_to(ROOT).as_posix(): p.read_text() for p in PAGES}
    for notebook in NOTEBOOKS:
        texts[notebook.relative_to(ROOT).as_posix()] = "\n".join(c.source for c in nbformat.read(notebook, 4).cells)
    return texts


def test_pip_install_lines_use_the_distribution_name():
    installs, wrong = [], []
    for name, text in install_texts().items():
        for match in PIP_INSTALL.finditer(text):
            for token in match.group(1).split():
                requirement = token.strip("'\"")
                if requirement.startswith("-") or "{" in requirement or requirement == ".":
                    continue
                installs.append((name, requirement))
                base = requirement.partition("[")[0]
                if base.endswith(".whl") and not Path(base).name.startswith(f"{WHEEL_PREFIX}-"):
                    wrong.append(f"{name}: {requirement}: the wheel is {WHEEL_PREFIX}-*.whl")
                elif base == "features":  # the import package's name: on PyPI an unrelated project
                    wrong.append(f"{name}: pip install {requirement}: the distribution is {DISTRIBUTION}")
    assert (DEPLOYMENT.relative_to(ROOT).as_posix(), f"{DISTRIBUTION}[local]") in installs, installs
    assert not wrong, "\n".join(wrong)
    named = [w for text in install_texts().values() for w in re.findall(r"[\w./<>*-]+\.whl\b", text)]
    assert named and all(Path(w).name.startswith(f"{WHEEL_PREFIX}-") for w in named), named
