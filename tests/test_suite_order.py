"""The suite's slowest-first list names test files that exist (a renamed file would silently go last)."""

from pathlib import Path

from tests.conftest import SLOWEST_FIRST

REPO = Path(__file__).resolve().parents[1]


def test_every_slowest_first_file_exists() -> None:
    missing = [p for p in SLOWEST_FIRST if not (REPO / p).is_file()]
    assert not missing, f"tests/conftest.py SLOWEST_FIRST names files that do not exist: {missing}"
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST), "a file is listed twice"
