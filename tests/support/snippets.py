"""Run a Python snippet in a fresh process, as a Dagster run process would be, and read its answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_snippet(code: str, *args: str, env: Mapping[str, str], timeout: int = 300) -> Any:
    """``python -c code args...`` with this project importable and ``env`` added; the JSON of the last
    line it prints. A failing snippet fails the test with the end of its stderr."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
