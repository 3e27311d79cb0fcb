"""``ngsi-assets history``: every action on a small lake, JSON lines out, errors with exit status 2."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession

from ngsi_assets.cli import main
from ngsi_assets.history_store import HistoryStore
from resources.lake import LakeResource
from tests.resources.test_history_store import SPACE, Clock, record, write_table


@pytest.fixture(scope="module")
def lake_root(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("cli") / "lake")
    store = HistoryStore(spark, LakeResource(root=root), clock=Clock())
    write_table(spark, store.lake, {"A": (False, "x", 1), "B": (False, "y", 2)}, 1)
    record(store, spark, 1)
    write_table(spark, store.lake, {"A": (False, "x2", 1), "B": (True, None, None)}, 2)
    record(store, spark, 2)
    return root


def run(root: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict], str]:
    code = main(["history", "--lake-root", root, *args])
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines() if line], out.err


def test_spaces_and_log(lake_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, _ = run(lake_root, capsys, "spaces")
    assert code == 0 and [(r["space"], r["transactions"], r["last_i"]) for r in rows] == [(SPACE, 2, 4)]
    code, rows, _ = run(lake_root, capsys, "log", SPACE)
    assert [(r["txn"], r["commit_json"]["actions"]) for r in rows] == [
        (1, {"CREATE": 2}),
        (2, {"UPDATE": 1, "DELETE": 1}),
    ]


def test_show_rewinds(lake_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, rows, _ = run(lake_root, capsys, "show", SPACE, "--at", "txn:1")
    assert [(r["id"], r["action"], r["state"]["name"]) for r in rows] == [("A", "CREATE", "x"), ("B", "CREATE", "y")]
    _, rows, _ = run(lake_root, capsys, "show", SPACE)
    assert [(r["id"], r["action"], r["state"].get("name")) for r in rows] == [
        ("A", "UPDATE", "x2"),
        ("B", "DELETE", None),
    ]
    _, rows, _ = run(lake_root, capsys, "show", SPACE, "--live", "--id", "A", "--id", "B")
    assert [r["id"] for r in rows] == ["A"]


def test_feature_diff_tags_and_layer(lake_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, rows, _ = run(lake_root, capsys, "feature", SPACE, "A")
    assert [(r["i"], r["action"]) for r in rows] == [(1, "CREATE"), (3, "UPDATE")]
    assert rows[1]["puuid"] == rows[0]["uuid"]
    _, rows, _ = run(lake_root, capsys, "diff", SPACE, "txn:1", "txn:2")
    assert [(r["id"], r["change"]) for r in rows] == [("A", "changed"), ("B", "changed")]
    code, rows, _ = run(lake_root, capsys, "tag", SPACE, "v1", "--at", "txn:1", "-m", "first")
    assert code == 0 and rows[0]["name"] == "v1" and rows[0]["message"] == "first"
    _, rows, _ = run(lake_root, capsys, "show", SPACE, "--at", "v1", "--live")
    assert [r["id"] for r in rows] == ["A", "B"]
    _, rows, _ = run(lake_root, capsys, "tags", SPACE)
    assert [r["name"] for r in rows] == ["v1"]
    _, rows, _ = run(lake_root, capsys, "layer", SPACE, SPACE, "--delta-at", "v1")
    assert [(r["id"], r["layer"]) for r in rows] == [("A", "delta"), ("B", "delta")]
    assert run(lake_root, capsys, "untag", SPACE, "v1")[0] == 0
    _, rows, _ = run(lake_root, capsys, "tags", SPACE)
    assert rows == []


def test_errors_name_the_problem(lake_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = run(lake_root, capsys, "show", "nope")
    assert code == 2 and rows == [] and "no transaction history for space 'nope'" in err
    code, _, err = run(lake_root, capsys, "show", SPACE, "--at", "txn:9")
    assert code == 2 and "has no transaction 9" in err
    code, _, err = run(lake_root, capsys, "tag", SPACE, "txn:1")
    assert code == 2 and "bad tag name" in err
    with pytest.raises(SystemExit):
        main(["history", "--lake-root", lake_root, "show", SPACE, "--time", "2026-05-01T08:00:00"])
    assert "has no zone" in capsys.readouterr().err


def test_a_real_process_writes_only_json_lines_to_stdout(lake_root: str) -> None:
    """The JVM's own log lines (log4j writes to the stdout it inherits) must not end up among the JSON lines."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "ngsi_assets.cli", "history", "--lake-root", lake_root, "spaces"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["space"] for line in done.stdout.splitlines()] == [SPACE]
