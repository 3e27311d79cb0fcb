"""The documentation: the site builds with no warning, the README stays short, and the configuration
reference names every variable the code reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ngsi_assets.config_reference import reference_markdown, variables

ROOT = Path(__file__).resolve().parents[1]
# Where the code reads NGSI_* variables: the packages and the scripts.
CODE = [*(ROOT / "ngsi_assets").rglob("*.py"), *(ROOT / "resources").rglob("*.py"), *(ROOT / "scripts").glob("*")]
CODE.append(ROOT / "Makefile")
_VARIABLE = re.compile(r"\bNGSI_[A-Z0-9_]*[A-Z0-9]\b")
_PYTHON_LITERAL = re.compile(r"[\"'](NGSI_[A-Z0-9_]*[A-Z0-9])[\"']")


def variables_read() -> set[str]:
    """Every NGSI_* variable the code names: a string literal in Python, a word in the shell scripts.

    Prefixes (``NGSI_STH_``, ``NGSI_MONGO_RAW_``) end with "_" and are not variables themselves: the
    sinks' models expand them, one variable per parameter.
    """
    found: set[str] = set()
    for path in CODE:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        found |= set(_PYTHON_LITERAL.findall(text) if path.suffix == ".py" else _VARIABLE.findall(text))
    return found


def test_every_variable_the_code_reads_is_in_the_reference() -> None:
    found = variables_read()
    assert {"NGSI_LAKE_ROOT", "NGSI_SPARK_REMOTE", "NGSI_TEST_WORKERS"} <= found  # the scan sees both kinds
    page = reference_markdown()
    missing = sorted(v for v in found if f"`{v}`" not in page)
    assert not missing, f"variables read by the code but missing from the configuration reference: {missing}"


def test_the_reference_has_one_row_per_variable_with_a_description() -> None:
    page = reference_markdown()
    for name in variables():
        (row,) = [line for line in page.splitlines() if line.startswith(f"| `{name}` |")]
        assert row.rstrip(" |").split("|")[-1].strip(), f"{name} has no description"


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details belong in docs/"


def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "configuration" / "reference" / "index.html").is_file()
    assert "NGSI_LAKE_ROOT" in (tmp_path / "site" / "configuration" / "reference" / "index.html").read_text()
