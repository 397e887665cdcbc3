"""The admin socket: each command changes the daemon as it says, and refuses clearly."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from typing import Iterator

import numpy as np
import pytest
import zmq

from infermux.client import AdminError
from support.harness import TWO_VERSIONS_AND_FAST, Daemon, exchange

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
        with pytest.raises(AdminError, match="fallback cycle: fast -> fast"):
            admin.call("set", model="fast", fallback="fast")
        with pytest.raises(AdminError, match="unknown fallback model 'ghost'"):
            admin.call("set", model="fast", fallback="ghost")
        with pytest.raises(AdminError, match="fallback 'fast' does not take the inputs of 'addone'"):
            admin.call("set", model="addone", fallback="fast")  # x[?,512] for x[?,4]
    assert version_row(d, "addone", "2")["fallback"] == ""


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


LOGFMT_PAIR = re.compile(r'\s*([\w.]+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')


def logfmt(line: str) -> dict[str, str]:
    """key=value pairs of a logfmt line (after its leading bare word); fails on anything else."""
    head, _, rest = line.partition(" ")
    pairs, at = {"_": head}, 0
    while at < len(rest):
        found = LOGFMT_PAIR.match(rest, at)
        assert found, f"not logfmt at {rest[at:]!r}"
        key, value = found.groups()
        pairs[key], at = json.loads(value) if value.startswith('"') else value, found.end()
    return pairs


def test_events_hold_history_and_audit_lines_name_the_uid(d: Daemon) -> None:
    with d.admin() as admin:
        admin.call("set", model="fast", max_queue=9)
        admin.call("set", model="fast", colour='say "hi"', check=False)  # refused, and quotes to escape
        events = admin.call("events", limit=50)["events"]
    kinds = [e["kind"] for e in events]
    assert "loaded" in kinds and "admin" in kinds
    accepted, refused = [e for e in events if e["kind"] == "admin"]
    assert accepted["cmd"] == "set" and accepted["uid"] == os.getuid() and accepted["pid"] > 0
    assert (accepted["model"], accepted["outcome"]) == ("fast", "accepted") and "reason" not in accepted
    assert (refused["model"], refused["outcome"]) == ("fast", "refused") and "cannot set colour" in refused["reason"]
    lines = [line[line.index("admin "):] for line in d.log().splitlines() if " admin model=" in line]
    parsed = [logfmt(line) for line in lines]
    assert [(p["model"], p["cmd"], p["outcome"]) for p in parsed] == [("fast", "set", "accepted"),
                                                                   ("fast", "set", "refused")]
    assert json.loads(parsed[1]["args"]) == {"colour": 'say "hi"', "model": "fast"}
    shown = subprocess.run([sys.executable, "-m", "infermux", "ctl", "events", "--config", str(d.config_path),
                            "--runtime-dir", str(d.run_dir)], capture_output=True, text=True, timeout=30)
    line = next(line for line in shown.stdout.splitlines() if "outcome=refused" in line)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\s+admin\s+fast\s", line), line


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


# -- fallbacks must take the same inputs; footprints are taken one way -------------------------

# classifier takes images[?,3,64,64], mlp features[?,256]: a fallback that cannot stand in.
# addone and addtwo both take x[?,4].
STAND_INS = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
contexts = 2
fallback = "mlp"
[[models]]
name = "mlp"
engine = "mlp/1/model.onnx"
[[models]]
name = "addone"
engine = "addone/1/model.onnx"
fallback = "addtwo"
[[models]]
name = "addtwo"
engine = "addone/2/model.onnx"
"""


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory, engines) -> Iterator[Daemon]:
    """One daemon for the fallback and footprint tests below (each leaves its models loaded)."""
    from support.harness import DAEMON_HEAD

    d = Daemon(tmp_path_factory.mktemp("stand-ins"), (DAEMON_HEAD + STAND_INS).format(engines=engines)).start()
    yield d
    assert d.stop() == 0, d.log()[-4000:]


def test_a_configured_fallback_with_other_inputs_is_removed_once_both_are_loaded(stand_ins: Daemon) -> None:
    with stand_ins.admin() as admin:
        events = admin.call("events", limit=1000)["events"]
    refused = [e for e in events if e["kind"] == "fallback_refused"]
    assert [(e["model"], e["fallback"]) for e in refused] == [("classifier", "mlp")], refused
    assert "images float32[?,3,64,64]" in refused[0]["reason"] and "features float32[?,256]" in refused[0]["reason"]
    assert version_row(stand_ins, "classifier", "1")["fallback"] == ""
    assert version_row(stand_ins, "addone", "1")["fallback"] == "addtwo"  # same inputs: kept


def test_ctl_set_refuses_a_fallback_with_other_inputs_naming_them(stand_ins: Daemon) -> None:
    base = [sys.executable, "-m", "infermux", "ctl", "--config", str(stand_ins.config_path),
            "--runtime-dir", str(stand_ins.run_dir), "set"]
    bad = subprocess.run(base + ["classifier", "fallback=mlp"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "fallback 'mlp' does not take the inputs of 'classifier'" in bad.stderr
    assert "input names differ" in bad.stderr and "images float32[?,3,64,64]" in bad.stderr
    assert version_row(stand_ins, "classifier", "1")["fallback"] == ""
    ok = subprocess.run(base + ["addone", "fallback=addtwo"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and '"fallback": "addtwo"' in ok.stdout and "note" not in ok.stdout, ok.stdout


def test_an_unloaded_model_is_served_by_its_fallback_or_says_it_stays_unloaded(stand_ins: Daemon) -> None:
    with stand_ins.admin() as admin:
        admin.call("unload", model="addone")
        admin.call("unload", model="classifier")
        try:
            with stand_ins.client() as client:
                served = client.infer("addone", {"x": X4})
                alone = client.infer("classifier", {"images": np.zeros((1, 3, 64, 64), np.float32)})
        finally:
            admin.call("load", model="addone")
            admin.call("load", model="classifier")
    assert served.status == 200 and served.fallback == {"from": "addone", "reason": "unloaded"}, served.header
    np.testing.assert_allclose(served.outputs["y"], X4 + 2)  # addtwo computed it
    assert alone.status == 503 and "is unloaded and does not come back by itself" in alone.error, alone.error
    assert "`infermux ctl load classifier`" in alone.error and "it has no fallback" in alone.error
    assert alone.header["retry_after_ms"] == 1000, alone.header  # as failed: not back by itself


def test_memory_footprint_is_the_same_whichever_path_loaded_it(stand_ins: Daemon, engines) -> None:
    weights = (engines / "classifier/1/model.onnx").stat().st_size

    def footprint() -> tuple[int, int, int]:
        """classifier's memory_bytes, the top line, and the sum of the rows, from one status."""
        with stand_ins.admin() as admin:
            status = admin.call("status")
        rows = {m["name"]: m["memory_bytes"] for m in status["models"]}
        return rows["classifier"], status["daemon"]["memory"]["models_bytes"], sum(rows.values())

    first = footprint()
    # One session for both contexts: the weights once, plus each context's image in and scores out.
    activations = 3 * 64 * 64 * 4 + 10 * 4
    assert first[0] == weights + 2 * activations and first[1] == first[2], first
    with stand_ins.admin(timeout_s=60) as admin:
        admin.call("unload", model="classifier")
        admin.call("load", model="classifier")
        again = footprint()
        copy = stand_ins.workdir / "classifier-copy.onnx"  # a hot swap: the same weights from a new file
        copy.write_bytes((engines / "classifier/1/model.onnx").read_bytes())
        stand_ins.config_path.write_text(stand_ins.config_path.read_text().replace(
            'engine = "classifier/1/model.onnx"', f'engine = "{copy}"'))
        assert admin.call("reload")["changes"]["reloaded"] == ["classifier:1"]
        swapped = footprint()
        admin.call("demote", model="classifier")
        cold = version_row(stand_ins, "classifier", "1")
        admin.call("promote", model="classifier")
        promoted = footprint()
    assert again == first and swapped == first and promoted == first, (first, again, swapped, promoted)
    assert cold["placement"] == "cold" and cold["memory_bytes"] > weights  # the worker's RSS: a whole process
