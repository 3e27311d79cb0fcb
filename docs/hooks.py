"""MkDocs hooks: pages generated from the repository, so that the site cannot drift from it.

- ``configuration/reference.md``: from the settings models (``ngsi_assets.config_reference``);
- ``benchmarks.md``: ``BENCHMARKS.md`` at the repository's root, the report the benchmark scripts
  write, with its links to repository files turned into plain text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def _benchmarks() -> str:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    # Links to files of the repository (benchmarks/..., ngsi_assets/...) are not pages of the site.
    return re.sub(r"\[([^\]]+)\]\((?!https?://|#)[^)]+\)", r"\1", text)


def on_files(files: Files, config: Any) -> Files:
    from ngsi_assets.config_reference import reference_markdown

    files.append(File.generated(config, "configuration/reference.md", content=reference_markdown()))
    files.append(File.generated(config, "benchmarks.md", content=_benchmarks()))
    return files
