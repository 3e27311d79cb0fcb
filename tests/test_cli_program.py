"""A process that loads the platform's definitions (a run's, ``ngsi-assets materialize``) freezes its
objects at the exit, so the interpreter's last garbage collections skip them; ``materialize``'s
arguments are refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ngsi_assets.cli import main

# Exit handlers run last registered first: this one, registered before the definitions load, runs
# after theirs.
_PROGRAM = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit", gc.get_freeze_count() > 0, flush=True))
from ngsi_assets.cli import main
code = main(["materialize"])
print("exit", code, "frozen before", gc.get_freeze_count() > 0, flush=True)
sys.exit(code)
"""


def test_a_process_with_the_definitions_freezes_its_objects_at_exit(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NGSI_")},
        "NGSI_LANDING_ROOT": str(landing),
        "NGSI_LAKE_ROOT": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path),
    }
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "nothing landed: no hours to materialize" in done.stdout
    assert done.stdout.strip().splitlines()[-2:] == ["exit 1 frozen before False", "frozen at exit True"]


@pytest.mark.parametrize(("value", "named"), [("0", "0"), ("-1", "-1"), ("two", "'two'")])
def test_materialize_refuses_a_bad_number_of_steps_side_by_side(
    value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["materialize", "--steps-side-by-side", value])
    assert exited.value.code == 2
    assert f"--steps-side-by-side: expected a whole number from 1, got {named}" in capsys.readouterr().err
