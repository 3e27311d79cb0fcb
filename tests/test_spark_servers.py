"""The command lines of the Spark servers the platform starts."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ngsi_assets.spark_servers import FAIR_SCHEDULER_FILE, connect_server_command


def _confs(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")


def test_the_connect_server_shares_its_cores_fairly_between_runs() -> None:
    confs = _confs(connect_server_command(15999))
    assert confs["spark.scheduler.mode"] == "FAIR"
    assert confs["spark.scheduler.allocation.file"] == str(FAIR_SCHEDULER_FILE)
    # Every client session's jobs run in the default pool: it must itself be FAIR (Spark makes it FIFO).
    pools = {p.get("name"): p for p in ET.parse(FAIR_SCHEDULER_FILE).getroot().iter("pool")}
    assert pools["default"].findtext("schedulingMode") == "FAIR"
    assert int(pools["default"].findtext("weight") or 0) >= 1
