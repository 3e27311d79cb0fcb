"""``ngsi-assets spark master`` refuses a port that is taken rather than let Spark move the master."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from ngsi_assets.cli import main
from ngsi_assets.spark_servers import MASTER_CLASS


class Exec(Exception):
    """Raised in place of ``os.execve``: the command the CLI would have become."""


@pytest.fixture
def no_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        raise Exec(argv)

    monkeypatch.setattr(os, "execve", execve)


def test_a_taken_master_port_is_refused_by_name(
    no_exec: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = main(["spark", "master", "--port", str(port), "--log-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is not free" in err
    assert f"spark://127.0.0.1:{port} would not find it" in err


def test_a_free_master_port_starts_the_master_on_it(no_exec: None, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Exec) as became:
        main(["spark", "master", "--port", str(port), "--log-dir", str(tmp_path)])
    argv = became.value.args[0]
    assert MASTER_CLASS in argv
    assert argv[argv.index("--port") + 1] == str(port)
