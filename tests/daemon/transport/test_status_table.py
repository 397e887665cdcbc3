"""`infermux status` shows where requests go: each version's weight and its share of the traffic.

Under `weighted` the default version is not where the traffic goes, so the
table shows WEIGHT and SHARE and keeps `*` for a default that takes every
request; `--json` carries the same figures (`weight`, `traffic_share`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from support.harness import DAEMON_HEAD, TWO_VERSIONS_AND_FAST

WEIGHTED = '[routing]\nstrategy = "weighted"\n'


def status(d, *flags: str) -> str:
    run = subprocess.run([sys.executable, "-m", "infermux", "status", "-e", d.admin_endpoint, *flags],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return run.stdout


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows by `name:version`, cells split on runs of spaces (the `*` stays on the name)."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("MODEL"))
    out = {}
    for line in lines[head + 1:]:
        cells = line.replace(" *", "*").split()
        if len(cells) > 3:
            out[f"{cells[0].rstrip('*')}:{cells[1]}"] = cells
    return out


def test_status_shows_each_versions_weight_and_share_and_marks_the_default_only_when_it_takes_all(make_daemon):
    d = make_daemon(TWO_VERSIONS_AND_FAST, head=DAEMON_HEAD + WEIGHTED)
    text = status(d)
    assert "WEIGHT" in text and "SHARE" in text, text
    table = rows(text)
    assert table["addone:2"][0] == "addone*" and table["addone:2"][4:6] == ["0", "100%"], text
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 90, "2": 10})
    table = rows(status(d))
    assert (table["addone:1"][4:6], table["addone:2"][4:6]) == (["90", "90%"], ["10", "10%"])
    assert table["addone:2"][0] == "addone"  # the default, no longer marked: it takes a tenth
    models = json.loads(status(d, "--json"))["models"]
    shares = {(m["name"], m["version"]): m["traffic_share"] for m in models}
    assert shares[("addone", "1")] == 90.0 and shares[("fast", "1")] == 100.0
    with d.admin() as admin:
        admin.call("pin", model="addone", version="1")
    shares = {(m["name"], m["version"]): m["traffic_share"] for m in json.loads(status(d, "--json"))["models"]}
    assert (shares[("addone", "1")], shares[("addone", "2")]) == (100.0, 0.0)  # pinned: all of it


def test_status_says_when_the_frontend_runs_pyzmqs_calls_and_the_log_says_which_run(make_daemon):
    from infermux.transport.wire import choose

    slow = make_daemon(TWO_VERSIONS_AND_FAST, env={"INFERMUX_WIRE": "python"})
    assert "frontend: pyzmq's socket calls: INFERMUX_WIRE=python is set" in status(slow)
    assert json.loads(status(slow, "--json"))["daemon"]["wire"]["kind"] == "python"
    assert "wire calls=python" in slow.log()
    default = make_daemon(TWO_VERSIONS_AND_FAST)
    assert f"wire calls={choose().kind}" in default.log()
    assert ("frontend:" in status(default)) == (not choose().compiled)


def test_status_says_when_the_express_lane_is_turned_off(make_daemon):
    from infermux.transport.wire import choose

    if not choose().compiled:
        pytest.skip("no express lane without the compiled socket calls")
    off = make_daemon(TWO_VERSIONS_AND_FAST, env={"INFERMUX_EXPRESS": "off"})
    assert "frontend: the express lane is off (INFERMUX_EXPRESS=off" in status(off)
    assert json.loads(status(off, "--json"))["daemon"]["express"] == {"on": False, "served": 0}


def test_status_counts_what_the_express_lane_served(make_daemon):
    from infermux.transport.wire import choose

    if not choose().compiled:
        pytest.skip("no express lane without the compiled socket calls")
    d = make_daemon(TWO_VERSIONS_AND_FAST)
    assert "express)" not in status(d).splitlines()[0]  # nothing served yet: no count
    with d.client(timeout_s=30) as client:
        for _ in range(20):  # the first request of a layout teaches it; the repeats may take the lane
            assert client.infer("fast", {"x": np.ones((1, 512), np.float32)}).status == 200
    served = json.loads(status(d, "--json"))["daemon"]["express"]["served"]
    assert served > 0
    assert f"20 requests ({served} express)" in status(d).splitlines()[0]
