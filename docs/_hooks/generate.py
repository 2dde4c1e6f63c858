"""MkDocs hook: adds the reference pages rendered from the code (phalanx.reference) to the site,
so the CLI, config and API references are rebuilt from the source on every build, and shows
benchmarks/README.md's results table on results.md (one table, kept beside the scripts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from phalanx.reference import PAGES


def on_files(files: Files, config: Any) -> Files:
    for name, render in PAGES.items():
        files.append(File.generated(config, f"reference/{name}.md", content=render()))
    return files


TABLE_START, TABLE_END = "<!-- results table: start -->", "<!-- results table: end -->"


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    marker = "<!-- results table: benchmarks/README.md -->"
    if marker not in markdown:
        return markdown
    readme = Path(config["config_file_path"]).parent / "benchmarks" / "README.md"
    text = readme.read_text(encoding="utf-8")
    table = text[text.index(TABLE_START) + len(TABLE_START) : text.index(TABLE_END)]
    return markdown.replace(marker, table.strip())
