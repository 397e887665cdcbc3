"""The admin socket: each command changes the daemon as it says, and refuses clearly."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from infermux.client import AdminError
from harness import TWO_VERSIONS_AND_FAST, Daemon, exchange

X4 = np.ones((1, 4), np.float32)
TWO_MODELS = TWO_VERSIONS_AND_FAST


@pytest.fixture
def d(make_daemon) -> Daemon:
    return make_daemon(TWO_MODELS)


def version_row(d: Daemon, name: str, version: str) -> dict:
    with d.admin() as admin:
        return next(m for m in admin.call("models")["models"] if (m["name"], m["version"]) == (name, version))


def test_status_lists_every_version_with_state(d: Daemon) -> None:
    with d.admin() as admin:
        reply = admin.call("status")
    assert reply["ok"] and reply["daemon"]["pid"] == d.proc.pid
    rows = {(m["name"], m["version"]): m for m in reply["models"]}
    assert set(rows) == {("addone", "1"), ("addone", "2"), ("fast", "1")}
    assert all(m["state"] == "ready" for m in rows.values())
    assert rows[("addone", "2")]["default"] and not rows[("addone", "1")]["default"]


def test_set_contexts_adds_contexts_and_requests_still_succeed(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("set", model="addone", version="2", contexts=3)
    assert version_row(d, "addone", "2")["contexts"] == 3
    with d.pipeline() as pipe:
        replies = pipe.gather([pipe.submit("addone", {"x": X4}) for _ in range(30)])
    assert all(r.status == 200 for r in replies)
    with d.admin() as admin:
        admin.call("set", model="addone", version="2", contexts=1)
    assert version_row(d, "addone", "2")["contexts"] == 1
    with d.client() as client:
        assert client.infer("addone", {"x": X4}).status == 200


def test_set_max_queue_timeout_and_batching(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("set", model="fast", max_queue=5, timeout_ms=77, max_batch=4, batch_delay_us=100)
    row = version_row(d, "fast", "1")
    assert (row["max_queue"], row["timeout_ms"], row["max_batch"], row["batch_delay_us"]) == (5, 77, 4, 100)


def test_set_fallback_refuses_cycles_and_unknown_models(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("set", model="addone", fallback="fast")
        with pytest.raises(AdminError, match="fallback cycle: (fast -> addone -> fast|addone -> fast -> addone)"):
            admin.call("set", model="fast", fallback="addone")
        with pytest.raises(AdminError, match="unknown fallback model 'ghost'"):
            admin.call("set", model="fast", fallback="ghost")
    assert version_row(d, "addone", "2")["fallback"] == "fast"


def test_weights_split_traffic_between_versions(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 0, "2": 1})
    with d.admin() as admin:
        with pytest.raises(AdminError, match="no version '7'"):
            admin.call("set", model="addone", weights={"7": 1})


def test_unload_then_load_again(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("unload", model="addone", version="1")
        assert version_row(d, "addone", "1")["state"] == "unloaded"
        with d.client() as client:
            reply = client.infer("addone", {"x": X4}, version="1")
        assert reply.status == 503 and "unloaded" in reply.error
        loaded = admin.call("load", model="addone", version="1")
    assert loaded["state"] == "ready"
    with d.client() as client:
        assert client.infer("addone", {"x": X4}, version="1").status == 200


def test_pin_serves_the_pinned_version_until_unpinned(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("pin", model="addone", version="1")
        with d.client() as client:
            assert client.infer("addone", {"x": X4}).version == "1"
        assert admin.call("unpin", model="addone")["default"] == "2"
        with d.client() as client:
            assert client.infer("addone", {"x": X4}).version == "2"


def test_drain_refuses_new_requests_until_resume(d: Daemon) -> None:
    with d.admin() as admin:
        assert admin.call("drain")["accepting"] is False
        with d.client() as client:
            refused = client.infer("fast", {"x": np.ones((1, 512), np.float32)})
        admin.call("resume")
        with d.client() as client:
            served = client.infer("fast", {"x": np.ones((1, 512), np.float32)})
    assert refused.status == 503 and "draining" in refused.error and refused.retry_after_ms
    assert served.status == 200


def test_events_hold_history_and_audit_lines_name_the_uid(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("set", model="fast", max_queue=9)
        events = admin.call("events", limit=50)["events"]
    kinds = [e["kind"] for e in events]
    assert "loaded" in kinds and "admin" in kinds
    audit = next(e for e in events if e["kind"] == "admin")
    assert audit["cmd"] == "set" and audit["uid"] == os.getuid() and audit["pid"] > 0
    assert "admin cmd=set" in d.log()


@pytest.mark.parametrize("request_, fragment", [
    ({"cmd": "explode"}, "unknown command 'explode'"),
    ({"nocmd": 1}, "unknown command None"),
    ({"cmd": "set", "model": "ghost", "contexts": 2}, "unknown model 'ghost'"),
    ({"cmd": "set", "model": "fast", "contexts": 0}, "'contexts' must be an integer >= 1"),
    ({"cmd": "set", "model": "fast", "colour": "red"}, "cannot set colour"),
    ({"cmd": "set", "model": "fast"}, "nothing to set"),
    ({"cmd": "load", "model": "addone", "version": "9"}, "has no version '9'"),
    ({"cmd": "pin", "model": "addone"}, "'version' is required"),
])
def test_invalid_commands_get_clear_errors(d: Daemon, request_: dict, fragment: str) -> None:
    with d.admin() as admin:
        cmd = request_.pop("cmd", None)
        reply = admin.call(cmd, check=False, **request_) if cmd else _raw(d, request_)
    assert reply["ok"] is False and fragment in reply["error"]


def _raw(d: Daemon, body: dict) -> dict:
    return json.loads(exchange(d.admin_endpoint, zmq.REQ, [json.dumps(body).encode()])[0])


def test_non_json_admin_request_is_refused(d: Daemon) -> None:
    reply = json.loads(exchange(d.admin_endpoint, zmq.REQ, [b"\xffnot json"])[0])
    assert reply["ok"] is False and "not JSON" in reply["error"]


def test_socket_files_are_mode_0660(d: Daemon) -> None:
    for name in ("admin.sock", "stats.sock", "infer.sock"):
        assert stat.S_IMODE((d.run_dir / name).stat().st_mode) == 0o660, name


def test_reload_applies_the_edited_file_and_keeps_it_on_errors(d: Daemon) -> None:
    text = d.config_path.read_text()
    d.config_path.write_text(text + '[[models]]\nname = "pair"\nengine = "pair/1/model.onnx"\n')
    with d.admin() as admin:
        changes = admin.call("reload")["changes"]
        assert changes["added"] == ["pair:1"]
        d.config_path.write_text(text + "[[models]]\nname = 3\n")
        with pytest.raises(AdminError, match=r"the running one stays: .*models\[3\]\.name"):
            admin.call("reload")
    a, b = np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)
    with d.client() as client:
        assert client.infer("pair", {"a": a, "b": b}).status == 200


def test_stats_stream_publishes_snapshots_and_events(d: Daemon) -> None:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(d.stats_endpoint)
    snapshots: list[dict] = []
    events: list[dict] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e["kind"] == "admin" for e in events):
            if snapshots:  # subscribed for sure: an event published now reaches us
                with d.admin() as admin:
                    admin.call("set", model="fast", max_queue=11)
            if sub.poll(500):
                topic, body = sub.recv_multipart()
                (snapshots if topic == b"snapshot" else events).append(json.loads(body))
    finally:
        sub.close()
    assert {m["name"] for m in snapshots[0]["models"]} == {"addone", "fast"}
    assert snapshots[0]["daemon"]["memory"]["budget_bytes"] > 0
    assert any(e["kind"] == "admin" and e["cmd"] == "set" for e in events)


def test_cli_status_and_ctl(d: Daemon) -> None:
    base = [sys.executable, "-m", "infermux"]
    where = ["--config", str(d.config_path), "--runtime-dir", str(d.run_dir)]
    status = subprocess.run(base + ["status", *where], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0 and "addone *" in status.stdout and "ready" in status.stdout
    ok = subprocess.run(base + ["ctl", "set", "fast", "contexts=2", *where], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and '"contexts": 2' in ok.stdout
    bad = subprocess.run(base + ["ctl", "set", "fast", "contexts=0", *where], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "'contexts' must be an integer >= 1" in bad.stderr
    gone = subprocess.run(base + ["status", "--endpoint", "ipc:///nonexistent/admin.sock"],
                          capture_output=True, text=True, timeout=30)
    assert gone.returncode == 3 and "is `infermux serve` running?" in gone.stderr
