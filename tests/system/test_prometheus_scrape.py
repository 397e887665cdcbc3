"""A real Prometheus scraping a real daemon: the Grafana dashboard's queries and the shipped rules,
evaluated through Prometheus' HTTP API against what the daemon exposed under real traffic.

One scene for the module: Prometheus (Debian's `prometheus` package, installed under CI; a skip
elsewhere) runs as a plain process with its own configuration, data directory and port in a temp
folder, scraping the daemon every second and evaluating packaging/prometheus/infermux-rules.yml
every second. The daemon then gets 200s, 503s while a model loads, 429s from a full queue, 504s,
three crashes of a cold worker (restarts, then failed), a hot swap and pipeline frames (one pipeline
tracking a stream); at the end cameras sending keyed frames to a model with queue_policy
newest_per_key (200s and 409s), one of which then stops (a silent stream); at the end it is
stopped. The tests then ask Prometheus:

- every expression of the dashboard (its template variables resolved as Grafana resolves "All")
  parses, and returns series unless ALLOWED_EMPTY says why it may not;
- every rule evaluates without error, every recording rule has series, and every alert but those
  in NOT_DRIVEN went pending or firing (InfermuxDown only once the daemon stopped);
- `promtool check metrics` accepts the exposition, and every family it declares has samples.

A broken expression is caught (test_a_broken_dashboard_expression_is_caught), so the check can fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import yaml
import zmq

from infermux.pipelines.wire import send_frame
from support import models, system_packages, tracking
from support.harness import REPO, Daemon, free_port
from support.polling import eventually
from support.publish import publish

# About 20 s (more the first time, when Prometheus is installed); it waits on Prometheus' own timing
# (targets applied on a 5 s tick, then scrapes and rule evaluations every second): tests/stress.sh runs it.
pytestmark = [pytest.mark.slow, pytest.mark.timing]

DASHBOARD = REPO / "packaging/grafana/infermux.json"
RULES = REPO / "packaging/prometheus/infermux-rules.yml"
SCRAPE_S = 1
# What Grafana's $__rate_interval stands for here: a window holding the whole scene's traffic.
RATE_INTERVAL = "1m"
# Dashboard expressions that may return nothing after the scene, by a metric name they read.
ALLOWED_EMPTY = {
    "infermux_gpu_": "no GPU here: the GPU families are declared without samples (docs/fleet.md)",
    "infermux_sink_": "the scene's configuration has no [[sinks]]: tests/daemon/sinks/test_object_events.py scrapes them",
    "infermux_pipeline_events_": "the scene's tracked pipeline has no `events` table (docs/events.md)",
    "infermux_camera_": "the scene's configuration has no [[cameras]]: tests/daemon/cameras/test_cameras.py scrapes them",
    "infermux_zone_objects": "the scene has no [[cameras.zones]]: tests/daemon/sinks/test_zone_events.py scrapes them",
    "infermux_line_crossings_": "the scene has no [[cameras.lines]]: tests/daemon/sinks/test_zone_events.py scrapes them",
}
# Alerts the scene does not drive (their promtool unit tests fire them).
NOT_DRIVEN = {
    "InfermuxMemoryBudgetNearlyFull": "the test models use a few MB; a budget they fill past 90% would refuse "
                                      "the cold worker's load",
    "InfermuxFrontendSaturated": "its recording rule is checked on this scene's data; holding the frontend thread "
                                 "over 90% of a core for the rule's window would take a flood of its own beside "
                                 "Prometheus on the same cores (promtool's unit test drives the alert)",
    "InfermuxSinkDown": "the scene has no [[sinks]]; promtool's unit test drives it, and "
                        "tests/daemon/sinks/test_object_events.py scrapes infermux_sink_up 0 from a sink that is down",
    "InfermuxSinkSpoolNearlyFull": "the scene has no [[sinks]]; promtool's unit test drives it, and "
                                   "tests/daemon/sinks/test_object_events.py scrapes a full spool's backlog",
    "InfermuxCameraLost": "the scene has no [[cameras]]; promtool's unit test drives it, and "
                          "tests/daemon/cameras/test_cameras.py sees a camera lost",
    "InfermuxCameraBelowFps": "the scene has no [[cameras]]; promtool's unit test drives it",
}

# Queries that find something once Prometheus has scraped the end of the scene and evaluated its rules.
CAUGHT_UP = ('infermux_model_swaps_total{model="m"} >= 1',
             'infermux_pipeline_frames_total{pipeline="camera",status="200"} >= 3',
             'model_version:infermux_worker_restarts:increase15m{model="cold"} >= 3',
             'model_version:infermux_batch_size:mean_rate5m{model="classifier"}',
             'ALERTS{alertname="InfermuxWorkerRestartLoop"}',
             'infermux_stream_superseded_total{model="cams",key="cam-1"} >= 1',
             'model_key:infermux_stream_dropped:ratio_rate5m{model="cams",key="cam-1"}',
             'ALERTS{alertname="InfermuxStreamSilent",model="cams"}',
             'ALERTS{alertname="InfermuxStreamSilent",model="tracked"}',
             'infermux_rollout_compared_requests{model="s"} >= 2')

X4 = np.arange(8, dtype=np.float32).reshape(2, 4)
BIG = np.ones((64, 512), np.float32)  # tens of ms per call on the 48-layer model


class Prometheus:
    """A Prometheus server of this test's own: config, data and port in `workdir`, nothing system-wide."""

    def __init__(self, workdir: Path, target: str, rules: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                       "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "infermux", "static_configs": [{"targets": [target]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [shutil.which("prometheus") or "prometheus", f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        eventually(self._ready, f"Prometheus ready on {self.url}", timeout_s=60)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, f"prometheus exited:\n{self.log()}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET /api/v1/<path>: the decoded answer, errors (400 for a query that does not parse) included."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        return self.api("query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))

    def series(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        answer = self.query(expr, at)
        assert answer["status"] == "success", f"{expr}: {answer.get('error')}"
        return answer["data"]["result"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Scene:
    """What the scene left for the tests to ask about."""

    prometheus: Prometheus
    exposition: str = ""
    traffic_done: float = 0.0  # wall-clock time, daemon still up: the dashboard is evaluated then
    statuses: dict[str, set[int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _config(root: Path, engines: Path, detector: Path, metrics_port: int) -> str:
    return f"""
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
max_message_bytes = 8388608
metrics_port = {metrics_port}
watch = true
watch_settle_s = 0.3
watch_debounce_s = 0.02
watch_rescan_s = 1.0
stream_silent_s = 1.0          # a camera that stops is silent after a second

[[models]]
name = "cams"                  # cameras: a newer frame replaces a waiting one (409)
engine = "{engines}/slower/1/model.onnx"
queue_policy = "newest_per_key"
timeout_ms = 20000
[[models]]
name = "flood"                 # 429s, and a queue at its bound
engine = "{engines}/slower/1/model.onnx"
max_queue = 5
timeout_ms = 20000
[[models]]
name = "tardy"                 # 504s: a 20 ms deadline behind long computes
engine = "{engines}/slower/1/model.onnx"
max_queue = 16
timeout_ms = 20
[[models]]
name = "cold"                  # a worker process: killed three times
engine = "{engines}/fast512/1/model.onnx"
placement = "cold"
preload = true
[[models]]
name = "classifier"            # the pipeline's model
engine = "{engines}/classifier/1/model.onnx"
[[models]]
name = "det"                   # the tracked pipeline's detector
engine = "{detector}"
[[models]]
name = "late"                  # 503s while it loads
engine = "{engines}/addone/1/model.onnx"
backend = "slow_load:SlowLoadBackend"
[models.options]
load_delay_s = 12.0  # past Prometheus' first scrapes (see the scene)

[[pipelines]]
name = "camera"
[[pipelines.steps]]
processor = "decode"
[[pipelines.steps]]
processor = "normalize"
[[pipelines.steps]]
model = "classifier"
""" + tracking.classifying("tracked", "classifier", "reinfer_every = 3")


def _loading_503s(d: Daemon, scene: Scene) -> None:
    """Requests to `late` while it loads: 503."""
    with d.client() as client:
        for _ in range(5):
            reply = client.infer("late", {"x": X4})
            assert reply.status == 503 and "loading" in reply.error, reply.header
    scene.statuses["late"] = {503}


def _ready(d: Daemon, names: set[str], timeout_s: float = 60.0) -> None:
    """Wait until every model in `names` is ready: the daemon was started without waiting (for `late`'s
    503s), and on a busy box the others may still be loading when those are seen."""
    def ready() -> bool:
        with d.admin() as admin:
            return names <= {m["name"] for m in admin.call("models")["models"] if m["state"] == "ready"}

    eventually(ready, f"models {sorted(names)} ready", timeout_s=timeout_s, interval_s=0.2)


def _until_served(d: Daemon, scene: Scene) -> None:
    with d.client() as client:
        eventually(lambda: client.infer("late", {"x": X4}).status == 200, "late served", timeout_s=30, interval_s=0.2)
    scene.statuses["late"].add(200)


def _flood(d: Daemon, scene: Scene, seen_by_prometheus: Callable[[], Any], timeout_s: float = 30.0) -> None:
    """Twelve requests in flight against a queue of 5, until Prometheus has seen the queue full (the alert
    on it pending): it stays full, the rest get 429."""
    seen: set[int] = set()
    x = BIG[:16]
    with d.pipeline(timeout_s=30) as pipe:
        outstanding, end = 0, time.monotonic() + timeout_s
        next_look, full = time.monotonic() + 1.0, False
        while not full or outstanding:
            while outstanding < 12 and not full:
                pipe.submit("flood", {"x": x})
                outstanding += 1
            reply = pipe.next_reply()
            outstanding -= 1
            seen.add(reply.status)
            if reply.status == 429:
                time.sleep(0.005)  # as a client honouring retry_after_ms would, without idling the queue
            if not full and time.monotonic() > next_look:
                full, next_look = bool(seen_by_prometheus()), time.monotonic() + 0.25
                assert full or time.monotonic() < end, f"Prometheus did not see flood's queue full in {timeout_s} s"
    assert seen == {200, 429}, seen
    scene.statuses["flood"] = seen


def _deadlines(d: Daemon, scene: Scene) -> None:
    """Bursts of long computes against a 20 ms deadline until some are answered 504 without computing."""
    seen: set[int] = set()
    with d.pipeline(timeout_s=30) as pipe:
        for _ in range(10):
            seen |= {r.status for r in pipe.gather([pipe.submit("tardy", {"x": BIG}) for _ in range(6)])}
            if 504 in seen:
                break
    assert 504 in seen and seen <= {200, 504}, seen
    scene.statuses["tardy"] = seen


def _worker(d: Daemon) -> dict[str, Any]:
    with d.admin() as admin:
        return next(m for m in admin.call("models")["models"] if m["name"] == "cold")


def _crash_the_worker_three_times(d: Daemon) -> None:
    """SIGKILL the cold worker; twice it is restarted (each time it serves again), the third time within
    a minute marks the version failed."""
    with d.client() as client:
        for crash in range(3):
            if crash:
                eventually(lambda: client.infer("cold", {"x": BIG[:1]}).status == 200, "cold worker restarted",
                       timeout_s=30, interval_s=0.05)
            pid = eventually(lambda: (_worker(d).get("worker") or {}).get("pid"), "a cold worker pid")
            os.kill(pid, signal.SIGKILL)
            d.wait_for(f"crashed model=cold version=1 pid={pid}")
    eventually(lambda: _worker(d)["state"] == "failed", "cold marked failed after three crashes")


def _swap(d: Daemon, root: Path) -> None:
    publish(root, "m", 2, offset=2)
    with d.client() as client:
        eventually(lambda: client.infer("m", {"x": X4}).version == "2", "version 2 of m serving", timeout_s=30)
    d.wait_for("swapped model=m version=2")


def _shadow(d: Daemon, root: Path) -> None:
    """A candidate shadowing `s` (docs/hot-swap.md#shadow-rollout), compared on a few requests."""
    publish(root, "s", 2, offset=1)
    d.wait_for("rollout_started model=s version=2", 30)
    with d.client() as client, d.admin() as admin:
        def compared() -> bool:
            assert client.infer("s", {"x": X4}).status == 200
            rows = [m for m in admin.call("models")["models"] if m["name"] == "s" and m.get("rollout")]
            return bool(rows) and rows[0]["rollout"]["compared"] >= 2
        eventually(compared, "the candidate of s compared", timeout_s=30)


def _frames(d: Daemon) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(d.endpoint)
    try:
        for _ in range(3):
            reply = send_frame(sock, "camera", np.zeros((64, 64, 3), np.uint8).tobytes(), "rgb", width=64, height=64)
            assert reply.status == 200, reply.header
        # a tracked stream: its regions computed and reused, its tracks held
        tracked = tracking.replay(sock, "tracked", tracking.crossing(), key="gate", frames=6)
        assert tracked.statuses == [200] * 6, tracked.headers
    finally:
        sock.close()


def _cameras(d: Daemon, scene: Scene) -> None:
    """Cameras (keys) sending to `cams` behind a long request: a frame replaced by a newer one of its
    camera gets 409, the newest 200; then cam-3 sends a few frames and stops: it goes silent."""
    seen: set[int] = set()
    with d.pipeline(timeout_s=30) as pipe:
        for _ in range(8):  # over several scrapes: a counter that rises between two of them has a rate
            ids = [pipe.submit("cams", {"x": BIG}), *(pipe.submit("cams", {"x": BIG[:1]}, key=key)
                                                      for key in ("cam-1", "cam-2", "cam-1", "cam-2"))]
            seen |= {r.status for r in pipe.gather(ids)}
            time.sleep(SCRAPE_S / 2)
    assert seen == {200, 409}, seen
    with d.client() as client:
        for _ in range(3):
            assert client.infer("cams", {"x": BIG[:1]}, key="cam-3").status == 200
    d.wait_for("stream_silent model=cams key=cam-3")
    scene.statuses["cams"] = seen


def _exposition(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _alert_expression(name: str) -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return next(r["expr"] for g in groups for r in g["rules"] if r.get("alert") == name)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Scene]:
    started = time.monotonic()
    installed_s = system_packages.require({"prometheus": "prometheus", "promtool": "prometheus"})
    work = tmp_path_factory.mktemp("prometheus")
    root = work / "engines"
    publish(root, "m", 1, offset=1)  # watched: version 2 is published during the scene
    publish(root, "s", 1, offset=1)  # with a rollout table: its version 2 stays a candidate to the end
    (root / "s" / "model.toml").write_text("[rollout]\nshadow_requests = 1000000\nmin_idle_cpu = 0\n")
    detector = models.brightness_map(work / "det" / "model.onnx")
    metrics_port = free_port()
    prom = Prometheus(work, f"127.0.0.1:{metrics_port}", RULES)
    scene = Scene(prom, seconds={"install": installed_s})
    (work / "daemon").mkdir()
    daemon = Daemon(work / "daemon", _config(root, engines, detector, metrics_port))
    try:
        t = time.monotonic()
        prom.start()  # first: it sees the daemon's models loading
        scene.seconds["prometheus start"] = time.monotonic() - t
        t = time.monotonic()
        daemon.start(wait_ready=False)
        # Prometheus applies its targets on a 5 s tick: its first scrapes come while `late` still loads.
        eventually(lambda: prom.series('infermux_model_state{model="late",state="loading"}'),
               "a scrape showing late loading", timeout_s=30, interval_s=0.2)
        _loading_503s(daemon, scene)
        _ready(daemon, {"flood", "tardy", "cams", "classifier", "det"})  # the hot models the scene drives
        _flood(daemon, scene, lambda: prom.series('ALERTS{alertname="InfermuxQueueNearlyFull"}'))
        _deadlines(daemon, scene)
        _until_served(daemon, scene)
        _crash_the_worker_three_times(daemon)
        _swap(daemon, root)
        _shadow(daemon, root)
        _frames(daemon)
        _cameras(daemon, scene)
        scene.seconds["traffic"] = time.monotonic() - t
        t = time.monotonic()
        for caught_up in CAUGHT_UP:  # the last of the traffic scraped, and the rules evaluated on it
            eventually(lambda: prom.series(caught_up), f"Prometheus has {caught_up}")
        scene.exposition = _exposition(metrics_port)
        down = _alert_expression("InfermuxDown")
        eventually(lambda: not prom.series(down), "InfermuxDown's expression empty while the daemon runs")
        scene.traffic_done = time.time()
        assert daemon.stop() == 0, daemon.log()
        eventually(lambda: prom.series('ALERTS{alertname="InfermuxDown"}'), "InfermuxDown pending once the "
               "daemon stopped")
        scene.seconds["rules and alerts"] = time.monotonic() - t
        yield scene
    finally:
        daemon.stop()
        prom.stop()
        scene.seconds["whole scene"] = time.monotonic() - started
        print("prometheus scene:", ", ".join(f"{k} {v:.1f} s" for k, v in scene.seconds.items()))


# --- the dashboard ----------------------------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expression) for every query of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def resolve_variables(prom: Prometheus, at: float) -> dict[str, str]:
    """Each template variable as Grafana sets it when "All" is picked: its label_values(...) found in
    Prometheus, joined as a regex (`(a|b)`); $__rate_interval as RATE_INTERVAL."""
    values = {"__rate_interval": RATE_INTERVAL}
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["definition"])
        assert match, f"variable {var['name']}: not label_values(selector, label): {var['definition']}"
        selector, label = substitute(match.group(1), values), match.group(2)
        found = sorted({s["metric"].get(label) for s in prom.series(selector, at)} - {None})
        assert found, f"variable {var['name']}: {selector} has no {label!r} label values"
        values[var["name"]] = "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in found) + ")"
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):  # $__rate_interval before any shorter name
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
    return expr


def problem(prom: Prometheus, expr: str, at: float, may_be_empty: bool = False) -> str | None:
    """Why `expr` fails the dashboard check (it does not evaluate, or finds nothing), or None.
    A stat's `... or vector(0)` would always find something: what comes before it must find data too."""
    answer = prom.query(expr, at)
    if answer["status"] != "success":
        return f"does not evaluate: {answer.get('errorType')}: {answer.get('error')}"
    fallback = re.fullmatch(r"(.+)\s+or\s+vector\(0\)", expr, re.S)
    if fallback:
        return problem(prom, fallback.group(1), at, may_be_empty)
    if not answer["data"]["result"] and not may_be_empty:
        return "returns no series"
    return None


def _allowed_empty(expr: str) -> str | None:
    return next((why for name, why in ALLOWED_EMPTY.items() if name in expr), None)


def test_every_dashboard_expression_evaluates_and_finds_data(scene: Scene) -> None:
    prom, at = scene.prometheus, scene.traffic_done
    values = resolve_variables(prom, at)
    exprs = dashboard_expressions()
    assert len(exprs) >= 30
    problems = []
    for title, expr in exprs:
        why = problem(prom, substitute(expr, values), at, may_be_empty=_allowed_empty(expr) is not None)
        if why:
            problems.append(f"{title!r}: {expr}\n    {why}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("break_it", [
    pytest.param(lambda e: e.replace("(", "", 1), id="unbalanced-parenthesis"),
    pytest.param(lambda e: e.replace("infermux_inference_request_success_total", "nv_inference_request_success"),
                 id="triton-metric-name"),
    pytest.param(lambda e: e.replace(":ratio_rate5m", ":ratio_rate1m"), id="unrecorded-series"),
    pytest.param(lambda e: e.replace('model=~"$model"', 'modle=~"$model"'), id="misspelt-label"),
    pytest.param(lambda e: e.replace("[$__rate_interval]", "[1x]"), id="bad-range"),
    pytest.param(lambda e: e.replace("histogram_quantile(", "histogram_quantil("), id="unknown-function"),
])
def test_a_broken_dashboard_expression_is_caught(scene: Scene, break_it: Callable[[str], str]) -> None:
    # The check above fails when a panel's query is wrong in any of these ways.
    prom, at = scene.prometheus, scene.traffic_done
    values = resolve_variables(prom, at)
    broken = [(expr, break_it(expr)) for _, expr in dashboard_expressions()]
    broken = [(expr, b) for expr, b in broken if b != expr]
    assert broken, "no dashboard expression has what this case breaks"
    for expr, b in broken:
        assert problem(prom, substitute(expr, values), at) is None, expr  # as shipped: fine
        assert problem(prom, substitute(b, values), at) is not None, f"not caught: {b}"


# --- the rules --------------------------------------------------------------------------------------

def test_every_rule_evaluates_and_every_recording_rule_finds_data(scene: Scene) -> None:
    prom, at = scene.prometheus, scene.traffic_done
    groups = prom.api("rules")["data"]["groups"]
    shipped = yaml.safe_load(RULES.read_text())["groups"]
    assert sorted(g["name"] for g in groups) == sorted(g["name"] for g in shipped)
    loaded = [r for g in groups for r in g["rules"]]
    assert len(loaded) == sum(len(g["rules"]) for g in shipped)
    for rule in loaded:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
        assert problem(prom, rule["query"], at, may_be_empty=rule["type"] == "alerting") is None, rule["name"]
        if rule["type"] == "recording":
            assert prom.series(rule["name"], at), f"recording rule {rule['name']} recorded nothing"


def test_the_alerts_the_traffic_drives_went_pending_or_firing(scene: Scene) -> None:
    prom = scene.prometheus
    named: dict[str, set[str]] = {}
    for s in prom.series("count_over_time(ALERTS[10m])"):  # every alert pending or firing during the scene
        named.setdefault(s["metric"]["alertname"], set()).add(s["metric"].get("model", ""))
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert set(NOT_DRIVEN) <= alerts
    assert alerts - set(NOT_DRIVEN) - set(named) == set(), f"never pending or firing; these were: {named}"
    # Each names the versions the scene broke, and not the others.
    assert named["InfermuxModelFailed"] == named["InfermuxWorkerRestartLoop"] == {"cold"}
    assert named["InfermuxRequestsRejected"] == named["InfermuxQueueNearlyFull"] == {"flood"}
    assert "late" in named["InfermuxVersionStuckLoading"]  # (cold's restarts load too)
    assert {"late", "tardy"} <= named["InfermuxServerErrors"] and "flood" not in named["InfermuxServerErrors"]
    # cam-3 stopped, and the tracked pipeline's one camera sent its frames and stopped; no other keys
    assert named["InfermuxStreamSilent"] == {"cams", "tracked"}


def test_the_daemon_down_alert_waits_for_the_daemon_to_stop(scene: Scene) -> None:
    prom = scene.prometheus
    assert not prom.series(_alert_expression("InfermuxDown"), scene.traffic_done)  # up: quiet
    (down,) = prom.series('ALERTS{alertname="InfermuxDown"}')
    assert down["metric"]["job"] == "infermux" and down["metric"]["alertstate"] in ("pending", "firing")


# --- the exposition ---------------------------------------------------------------------------------

def test_promtool_accepts_the_exposition(scene: Scene) -> None:
    promtool = shutil.which("promtool")
    assert promtool
    r = subprocess.run([promtool, "check", "metrics"], input=scene.exposition, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_every_declared_family_has_samples(scene: Scene) -> None:
    lines = scene.exposition.splitlines()
    declared = {line.split()[2] for line in lines if line.startswith("# TYPE ")}
    sampled = {re.split(r"[{ ]", line, 1)[0] for line in lines if line and not line.startswith("#")}
    empty = {f for f in declared if not any(s == f or s.startswith(f + "_") for s in sampled)}
    assert all(_allowed_empty(f) for f in empty), sorted(empty)
