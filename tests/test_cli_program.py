"""The ``ngsi-assets`` program (``console_main``): ``main``'s exit code, with the interpreter's
objects frozen before the exit (so its last garbage collections skip them), and the arguments of
``materialize`` refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ngsi_assets.cli import main

_PROGRAM = """
import gc, sys
import ngsi_assets.cli as cli
sys.argv = ["ngsi-assets", "materialize"]
try:
    cli.console_main()
except SystemExit as e:
    print("exit", e.code, "frozen", gc.get_freeze_count() > 0)
"""


def test_the_program_exits_with_mains_code_and_frozen_objects(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NGSI_")},
        "NGSI_LANDING_ROOT": str(landing),
        "NGSI_LAKE_ROOT": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "nothing landed: no hours to materialize" in out
    assert out.strip().endswith("exit 1 frozen True")


@pytest.mark.parametrize(("value", "named"), [("0", "0"), ("-1", "-1"), ("two", "'two'")])
def test_materialize_refuses_a_bad_number_of_steps_side_by_side(
    value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["materialize", "--steps-side-by-side", value])
    assert exited.value.code == 2
    assert f"--steps-side-by-side: expected a whole number from 1, got {named}" in capsys.readouterr().err
