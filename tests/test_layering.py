"""The layering of the product code: ``resources/`` does file and database I/O and configuration, the
Spark logic lives in ``ngsi_assets/transforms/``, and ``resources/`` never imports it (nor the assets or
the modules that orchestrate transforms and I/O, such as the history store).

Read from each module's syntax tree, so imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What resources/ must not import: Spark logic, and what is built on it.
ABOVE_RESOURCES = ("ngsi_assets.transforms", "ngsi_assets.assets", "ngsi_assets.history_store", "ngsi_assets.sinks")


def imported_modules(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of every import in the module, at any depth ("from a import b" also names a.b)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def layering_faults(source: str, filename: str = "<source>") -> list[str]:
    return sorted(
        {
            f"{line}: {module}"
            for line, module in imported_modules(source, filename)
            if any(module == p or module.startswith(p + ".") for p in ABOVE_RESOURCES)
        }
    )


def resource_modules() -> list[Path]:
    return sorted((REPO / "resources").rglob("*.py"))


def test_the_resource_modules_are_found() -> None:
    names = {p.name for p in resource_modules()}
    assert {"lake.py", "history.py", "spark.py"} <= names


@pytest.mark.parametrize("path", resource_modules(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_resources_import_no_transforms(path: Path) -> None:
    assert layering_faults(path.read_text(), str(path)) == []


@pytest.mark.parametrize(
    "code",
    [
        "from ngsi_assets.transforms.transaction_history import changes",
        "import ngsi_assets.transforms.sth",
        "def f():\n    from ngsi_assets.sinks import history_pg\n",
        "from ngsi_assets import transforms",
        "from ngsi_assets.history_store import HistoryStore",
    ],
)
def test_the_check_finds_imports_from_above(code: str) -> None:
    assert layering_faults(code) != []


def test_the_check_allows_domain_code() -> None:
    assert layering_faults("from ngsi_assets.ngsi.entity_schema import load_schema\nimport pyarrow.fs") == []
