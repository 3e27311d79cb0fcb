"""The file loader and the ``load`` command: same validation and landing as the receiver."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from ngsi_assets.cli import main
from ngsi_assets.ingest.landing import LandingWriter
from ngsi_assets.ingest.loader import LoadReport, Rejection, default_headers, load_paths
from ngsi_assets.ngsi.envelope import MessageIdFactory, hour_dir
from ngsi_assets.ngsi.payloads import Endpoint, IngestSettings
from tests.ingest import samples
from tests.ingest.harness import landed, landed_lines, raw_body, snapshot

NOW = 1_795_000_000.0  # 2026-11-18 08:26:40 UTC
BIG = "123456789012345678901234567890"  # beyond 64 bits: must land digit for digit


def line(**record: object) -> bytes:
    return orjson.dumps(record) + b"\n"


def write_requests(path: Path) -> Path:
    path.write_bytes(
        line(endpoint="notify", headers={"Fiware-Service": "vehicles"}, body=samples.v2_normalized("Car1"))
        + b"\n"  # blank lines are skipped, not counted
        + line(
            endpoint="notify",
            headers={"Content-Type": "application/json", "Ngsiv2-AttrsFormat": "keyValues"},
            body_text='{"subscriptionId": "s",\r\n "data": [{"id": "Car2", "type": "Car", "big": ' + BIG + "}]}",
        )
        + line(endpoint="ngsi-ld", headers={"Content-Type": "application/ld+json"}, body=samples.ld_notification())
        + line(endpoint="messages", body=samples.datahub_message("g-1"))
        + b'{"endpoint": "notify", "body": \n'  # 6: malformed line
        + line(endpoint="nowhere", body={})  # 7
        + line(endpoint="notify", body_text='{"subscriptionId": ')  # 8
        + line(endpoint="notify", headers={"Content-Type": "text/plain"}, body=samples.v2_normalized())  # 9
        + line(endpoint="notify", headers={"Fiware-Service": 7}, body={})  # 10
        + line(endpoint="notify", body={"subscriptionId": "s", "data": []})  # 11
        + line(endpoint="notify", body={}, body_text="{}")  # 12
        + b"[1, 2]\n"  # 13
        + line(endpoint="notify", headers={}, body=samples.v2_normalized("Car3"))  # 14: no Content-Type
        + b'{"endpoint": "notify", "body": {"subscriptionId": "torn'  # 15: no newline, unterminated
    )
    return path


def run_load(paths: list[Path], root: Path, **kwargs: object) -> LoadReport:
    with LandingWriter(root) as writer:
        return load_paths(
            paths,
            writer,
            IngestSettings(),
            MessageIdFactory(),
            clock=lambda: NOW,
            **kwargs,  # type: ignore[arg-type]
        )


def test_json_lines_good_and_bad(tmp_path: Path) -> None:
    source = write_requests(tmp_path / "requests.jsonl")
    root = tmp_path / "landing"
    report = run_load([source], root)

    assert report.accepted == 5
    assert report.files == 1
    where = {int(r.source.rsplit(":", 1)[1]): r for r in report.rejections}
    assert sorted(where) == [6, 7, 8, 9, 10, 11, 12, 13, 15]
    assert all(r.source.startswith(f"{source}:") for r in report.rejections)
    assert (where[6].status, where[6].field) == (400, "line")
    assert (where[7].status, where[7].field) == (400, "endpoint") and "nowhere" in where[7].problem
    assert (where[8].status, where[8].field) == (400, "body")
    assert (where[9].status, where[9].field) == (415, "header Content-Type")
    assert (where[10].status, where[10].field) == (400, "headers")
    assert (where[11].status, where[11].field) == (400, "data")
    assert (where[12].status, where[12].field) == (400, "body") and "exactly one" in where[12].problem
    assert (where[13].status, where[13].field) == (400, "line")
    assert where[15].field == "line"
    assert not report.ok and report.rejected == 9
    assert str(where[9]).startswith(f"{source}:9: 415 header Content-Type: ")

    records = landed(root)
    assert [r["kind"] for r in records] == ["ngsi-v2", "ngsi-v2", "ngsi-ld", "message", "ngsi-v2"]
    assert {r["origin"] for r in records} == {"file:requests.jsonl"}
    assert {r["recv_ms"] for r in records} == {int(NOW * 1000)}
    assert all(hour_dir(int(NOW * 1000)) in str(p) for p in root.iterdir() for _ in [p])
    assert records[0]["service"] == "vehicles"
    assert records[1]["format"] == "keyValues"
    assert records[3]["guid"] == "g-1" and records[3]["format"] == "datahub"
    assert records[4]["body"]["data"][0]["id"] == "Car3"
    # body_text lands verbatim (CR/LF as spaces), big integers included.
    assert raw_body(landed_lines(root)[1]) == (
        b'{"subscriptionId": "s",   "data": [{"id": "Car2", "type": "Car", "big": 123456789012345678901234567890}]}'
    )
    assert len({r["message_id"] for r in records}) == 5


def test_folder_of_json_bodies_with_cli_headers(tmp_path: Path) -> None:
    folder = tmp_path / "bodies"
    (folder / "nested").mkdir(parents=True)
    (folder / "a.json").write_bytes(samples.pretty(samples.v2_key_values("A")))
    (folder / "nested" / "b.json").write_bytes(samples.dumps(samples.v2_key_values("B")))
    (folder / "c.json").write_bytes(samples.dumps(samples.v2_key_values("C")))
    (folder / "d.json").write_bytes(b"{not json")
    (folder / "README.md").write_bytes(b"ignored")
    root = tmp_path / "landing"
    report = run_load(
        [folder],
        root,
        endpoint=Endpoint.NOTIFY,
        headers=default_headers(service="fleet", service_path="/cars", attrs_format="keyValues"),
    )
    assert report.files == 4
    assert report.accepted == 3
    assert report.rejections == [Rejection(str(folder / "d.json"), 400, "body", report.rejections[0].problem)]
    records = landed(root)
    assert [r["origin"] for r in records] == ["file:a.json", "file:c.json", "file:b.json"]
    assert {(r["service"], r["service_path"], r["format"]) for r in records} == {("fleet", "/cars", "keyValues")}


def test_json_body_values_keep_their_exact_value(tmp_path: Path) -> None:
    body = samples.v2_key_values("Big")
    source = tmp_path / "big.jsonl"
    source.write_bytes(
        b'{"headers": {"Ngsiv2-AttrsFormat": "keyValues"}, "body": '
        + orjson.dumps(body)[:-3]
        + b', "big": '
        + BIG.encode()
        + b', "f": 0.1, "s": "\\ud83d\\ude00 \\u00e9"}]}}\n'
    )
    report = run_load([source], tmp_path / "landing")
    assert report.ok, report.rejections
    (line_bytes,) = landed_lines(tmp_path / "landing")
    assert b'"big":' + BIG.encode() in raw_body(line_bytes)
    entity = landed(tmp_path / "landing")[0]["body"]["data"][0]
    assert (entity["f"], entity["s"]) == (0.1, "\U0001f600 \u00e9")


def test_text_that_cannot_be_utf8_is_a_rejection_not_a_failed_load(tmp_path: Path) -> None:
    name = os.fsdecode(b"caf\xe9.jsonl")  # a file name that is not UTF-8
    source = tmp_path / name
    source.write_bytes(
        b'{"headers": {"Fiware-Service": "s\\udcff"}, "body": ' + samples.dumps(samples.v2_normalized()) + b"}\n"
        + line(body=samples.v2_normalized("Fine"))
    )  # fmt: skip
    report = run_load([source], tmp_path / "landing")
    assert report.write_error is None
    assert report.accepted == 1
    (rejection,) = report.rejections
    assert (rejection.status, rejection.field) == (400, "header Fiware-Service")
    assert rejection.source.endswith("caf\ufffd.jsonl:1")
    assert landed(tmp_path / "landing")[0]["origin"] == "file:caf\ufffd.jsonl"


def test_missing_path_is_a_rejection(tmp_path: Path) -> None:
    report = run_load([tmp_path / "nope.jsonl"], tmp_path / "landing")
    assert report.accepted == 0
    assert [(r.status, r.field) for r in report.rejections] == [(400, "path")]


def test_write_failure_stops_the_load_and_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "landing"
    root.mkdir()
    (root / hour_dir(int(NOW * 1000))).write_bytes(b"")  # blocks the hour folder
    source = tmp_path / "r.jsonl"
    source.write_bytes(line(body=samples.v2_normalized()) * 3)
    report = run_load([source], root, batch_size=2)
    assert report.accepted == 0
    assert report.write_error and not report.ok


def test_cli_load_reports_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "landing"
    good = tmp_path / "good.jsonl"
    good.write_bytes(line(body=samples.v2_normalized("X")) + line(endpoint="messages", body=samples.datahub_message()))
    assert main(["load", str(good), "--landing-root", str(root)]) == 0
    assert capsys.readouterr().out.strip().endswith("files 1, accepted 2, rejected 0")

    mixed = write_requests(tmp_path / "mixed.jsonl")
    before = len(landed(root))
    assert main(["load", str(mixed), "--landing-root", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "files 1, accepted 5, rejected 9"
    assert f"{mixed}:9: 415 header Content-Type: " in "\n".join(out)
    assert len(landed(root)) == before + 5

    assert main(["load", str(mixed), "--landing-root", str(root), "--json"]) == 1
    report = orjson.loads(capsys.readouterr().out)
    assert report["accepted"] == 5 and report["rejected"] == 9
    assert {"source", "status", "field", "problem"} == set(report["rejections"][0])


def test_cli_load_json_bodies_with_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "landing"
    folder = tmp_path / "msgs"
    folder.mkdir()
    (folder / "m1.json").write_bytes(samples.dumps(samples.datahub_message("m-1")))
    (folder / "m2.json").write_bytes(samples.dumps(samples.datahub_message("m-2")))
    code = main(["load", str(folder), "--landing-root", str(root), "--endpoint", "messages", "--service", "hub"])
    assert code == 0, capsys.readouterr().out
    records = landed(root)
    assert [(r["kind"], r["service"], r["guid"]) for r in records] == [
        ("message", "hub", "m-1"),
        ("message", "hub", "m-2"),
    ]


def test_cli_load_uses_landing_root_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "from-env"
    monkeypatch.setenv("NGSI_LANDING_ROOT", str(root))
    source = tmp_path / "one.json"
    source.write_bytes(samples.dumps(samples.v2_normalized()))
    before = snapshot(root)
    assert main(["load", str(source)]) == 0
    assert snapshot(root) != before and len(landed(root)) == 1
