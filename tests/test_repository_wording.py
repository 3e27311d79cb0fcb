"""The repository speaks of the product: no numbered work sessions in any file it holds.

Spark sessions, database sessions and the like are of course fine; what is refused is a reference to
how the work was organised (the word followed by a number), which means nothing to a user. This
file spells its examples in parts, so that it passes its own test.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The word, then a number, maybe after "#" or "-": a numbered session.
NUMBERED_SESSION = re.compile(r"\bsessions?[ \t]*[#-]?[ \t]*\d+\b", re.IGNORECASE)
SKIPPED_DIRS = {".git", ".venv", "node_modules", "site", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}


def repository_files() -> list[Path]:
    """The files git tracks (and the untracked ones it does not ignore), else every file of the tree."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(ROOT).parts)]


def test_the_pattern_finds_numbered_sessions_and_nothing_else() -> None:
    word = "sess" + "ion"
    for text in (f"{word} 54", f"BENCHMARKS.md, {word.title()} 55", f"{word}s 12-14", f"{word} #7", f"{word}-30"):
        assert NUMBERED_SESSION.search(text), text
    for text in ("a Spark session", "SparkSession", "session_id = 3", "the Connect session's 2 tags"):
        assert not NUMBERED_SESSION.search(text), text


def test_no_file_of_the_repository_names_a_numbered_session() -> None:
    found = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for n, line in enumerate(text.splitlines(), 1):
            if NUMBERED_SESSION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "numbered work sessions named:\n" + "\n".join(found)
