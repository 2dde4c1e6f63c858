"""MkDocs hook: adds the reference pages rendered from the code (phalanx.reference) to the site,
so the CLI, config and API references are rebuilt from the source on every build."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from phalanx.reference import PAGES


def on_files(files: Files, config: Any) -> Files:
    for name, render in PAGES.items():
        files.append(File.generated(config, f"reference/{name}.md", content=render()))
    return files
