"""The README and the reference in docs/ hold together (no Spark): every relative link leads to a file (and a
heading, where it names one), every `features <command>` they show exists with the flags they give it,
docs/commands.md documents every command and flag of the parser, the README stays short, and nothing cites a
file the repository does not contain."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from features.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
README_MAX_LINES = 210

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ENV = re.compile(r"^(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S+\s+)*")
JOB = re.compile(r"^(?:\S*spark-submit\s+(?:--\S+\s+\S+\s+)*)?(?:\S*/)?jobs/(backfill|stream)\.py\b")


# ---------------------------------------------------------------------------------------------------------
# Reading markdown: prose apart from code, headings as GitHub anchors them


def split_code(text: str) -> tuple[str, list[list[str]]]:
    """The page's prose (fenced blocks blanked, so line numbers stay) and its fenced blocks, as lists of lines."""
    prose, blocks, block = [], [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if block is None:
                block = []
            else:
                blocks.append(block)
                block = None
            prose.append("")
        elif block is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    prose, _ = split_code(page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in prose.splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def prose_without_spans(prose: str) -> str:
    return SPAN.sub(lambda m: " " * len(m.group(0)), prose)


def relative_links(page: Path) -> Iterator[str]:
    prose, _ = split_code(page.read_text())
    for match in LINK.finditer(prose_without_spans(prose)):
        target = match.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... are not files here
            yield target


# ---------------------------------------------------------------------------------------------------------
# Commands shown in the docs


def shell_lines(block: list[str]) -> Iterator[str]:
    """A code block's commands: a line ending in a backslash, or followed by indented `[...]`/`(...)`/`--...`
    lines (a synopsis), joined with what continues it; comments dropped."""
    current: str | None = None
    for raw in block:
        line = re.sub(r"\s+#\s.*$", "", raw).rstrip()
        if current is not None and (current.endswith("\\") or re.match(r"^\s+[\[(]|^\s+--", line)):
            current = current.rstrip("\\") + " " + line.strip()
            continue
        if current is not None:
            yield current
        current = line
    if current is not None:
        yield current


def command_texts(page: Path) -> Iterator[str]:
    """Every inline code span and code-block command of the page, whitespace normalized."""
    prose, blocks = split_code(page.read_text())
    for match in SPAN.finditer(prose):
        yield " ".join(match.group(2).split())
    for block in blocks:
        for line in shell_lines(block):
            yield " ".join(line.split())


def as_command(text: str) -> tuple[str, str] | None:
    """(command, its arguments) when `text` runs `features <command>` or a jobs/ entry point, else None."""
    text = ENV.sub("", text)
    job = JOB.match(text)
    if job is not None:
        return job.group(1), text[job.end() :]
    match = re.match(r"^features\s+([a-z][\w-]*)(.*)$", text)
    if match is None:
        return None
    return match.group(1), match.group(2)


@cache
def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flags_of(command: str) -> set[str]:
    return {o for a in subcommands()[command]._actions for o in a.option_strings if o.startswith("--")}


def documented_commands() -> list[tuple[str, str, str]]:
    """(page, command, arguments) of every command the docs show."""
    found = []
    for page in PAGES:
        for text in command_texts(page):
            command = as_command(text)
            if command is not None:
                found.append((page.relative_to(ROOT).as_posix(), *command))
    return found


def commands_page_sections() -> dict[str, str]:
    """docs/commands.md's sections per command: `## \\`features X\\`` -> the section's text."""
    text = (ROOT / "docs" / "commands.md").read_text()
    parts = re.split(r"^## `features ([a-z-]+)`\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


# ---------------------------------------------------------------------------------------------------------
# Tests


def test_the_docs_exist_and_the_readme_stays_short():
    assert (ROOT / "docs" / "semantics.md") in DOCS and (ROOT / "docs" / "commands.md") in DOCS
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: {file.relative_to(ROOT)} has no heading with anchor #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_a_broken_anchor(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## `features x` and more\n\nSee [here](#features-x-and-more), [there](#nowhere).\n")
    assert anchors(page) == {"title", "features-x-and-more"}
    assert list(relative_links(page)) == ["#features-x-and-more", "#nowhere"]


def test_every_command_shown_exists_with_its_flags():
    shown = documented_commands()
    assert len({c for _, c, _ in shown}) >= 6, shown  # the parsing found the docs' commands at all
    wrong = []
    for page, command, arguments in shown:
        if command not in subcommands():
            wrong.append(f"{page}: `features {command}` is not a command ({', '.join(subcommands())})")
            continue
        for flag in FLAG.findall(arguments):
            if flag not in flags_of(command) | {"--help"}:
                wrong.append(f"{page}: `features {command}` has no flag {flag}")
    assert not wrong, "\n".join(wrong)


def test_the_commands_page_documents_every_command_and_flag():
    sections = commands_page_sections()
    assert set(sections) == set(subcommands()), "docs/commands.md needs one `## `features X`` section per command"
    wrong = []
    for command, section in sections.items():
        listed = set(re.findall(r"^- `(--[a-z][a-z0-9-]*)", section, flags=re.M))
        for flag in sorted(listed - flags_of(command)):
            wrong.append(f"`features {command}` documents {flag}, which it does not have")
        for flag in sorted(flags_of(command) - {"--help", "--repo"} - set(FLAG.findall(section))):
            wrong.append(f"`features {command}`: its flag {flag} is not documented in its section")
    assert not wrong, "\n".join(wrong)


def test_command_parsing_of_synopses_and_jobs():
    block = [
        "features backfill --repo PATH (--since-last | --date D)   # one day",
        "                  [--group NAME ...] [--dry-run]",
        "spark-submit jobs/stream.py --repo PATH --trigger 5s",
        "curl -X POST http://h/x \\",
        "  -d '{}'",
    ]
    lines = list(shell_lines(block))
    assert as_command(" ".join(lines[0].split())) == (
        "backfill",
        " --repo PATH (--since-last | --date D) [--group NAME ...] [--dry-run]",
    )
    assert as_command(lines[1]) == ("stream", " --repo PATH --trigger 5s")
    assert as_command(lines[2]) is None
    assert as_command("SPARK_REMOTE=sc://host:15002 features backfill ...") == ("backfill", " ...")
    assert as_command("features.apply(repo)") is None


SKIP_DIRS = {".git", ".venv", "data", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
             ".ipynb_checkpoints", "spark-warehouse", "metastore_db", "mlruns", "features.egg-info"}  # fmt: skip


def repository_files() -> Iterator[Path]:
    """The repository's own files: not the virtualenv, git's store, caches or data folders (benchmarks' too)."""
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not (here.name == "bench" and d.startswith("work"))]
        yield from (here / f for f in files)


def test_nothing_cites_a_design_file_the_repository_does_not_have():
    missing = "DESIGN" + ".md"  # spelled apart, so that this file does not cite it either
    assert not (ROOT / missing).exists()
    citing = [
        p.relative_to(ROOT).as_posix()
        for p in repository_files()
        if p.stat().st_size < 5_000_000 and missing.encode() in p.read_bytes()
    ]
    assert not citing, f"these files cite {missing}, which is not in the repository; cite docs/ instead: {citing}"


def test_every_aggregation_is_in_the_definitions_table_and_the_semantics_with_its_empty_value():
    from features.spec import AggKind
    from features.spec.aggregations import Empty

    table = (ROOT / "docs" / "definitions.md").read_text()
    semantics = (ROOT / "docs" / "semantics.md").read_text()
    shown = {"0": Empty.ZERO, "null": Empty.NULL, "{}": Empty.EMPTY_MAP, "[]": Empty.EMPTY_LIST}
    for kind in AggKind:
        rows = [line for line in table.splitlines() if re.search(rf"`{kind.value}\(", line) and line.count("|") > 4]
        assert len(rows) == 1, f"docs/definitions.md's aggregation table has {len(rows)} rows for {kind.value}"
        empty = rows[0].split("|")[3].strip()
        assert shown[empty] is kind.op.empty, f"docs/definitions.md says {kind.value} of an empty window is {empty}"
        assert re.search(rf"[`.]{kind.value}\(", semantics), f"docs/semantics.md does not define {kind.value}"
