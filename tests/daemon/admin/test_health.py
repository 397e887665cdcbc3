"""/healthz and /readyz on the metrics port: what load balancers and Kubernetes probes read."""

from __future__ import annotations


import pytest

from support.metrics import probe
from support.harness import DAEMON_HEAD, free_port
from infermux.admin.health import Liveness
from support.clock import Clock


def test_liveness_follows_the_loop_turns() -> None:
    clock = Clock()
    live = Liveness(clock, within_s=10.0)
    assert not live.verdict().ok and "not started" in live.verdict().reason
    live.tick()
    clock.now += 10.0
    assert live.verdict().ok and live.verdict().status == 200
    clock.now += 0.5
    verdict = live.verdict()
    assert verdict.status == 503 and "not turned for 10.5 s" in verdict.reason
    assert live.verdict(stopping=True).ok  # draining to stop is not a wedged loop
    live.tick()
    assert live.verdict().ok


@pytest.fixture
def port_and_daemon(make_daemon):
    port = free_port()
    d = make_daemon('[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n',
                    head=DAEMON_HEAD + f"metrics_port = {port}\n")
    return port, d


def test_a_serving_daemon_is_alive_and_ready(port_and_daemon) -> None:
    port, _ = port_and_daemon
    assert probe(port, "/healthz") == (200, "alive\n")
    assert probe(port, "/readyz") == (200, "ready\n")


def test_a_draining_daemon_is_alive_but_not_ready(port_and_daemon) -> None:
    port, d = port_and_daemon
    with d.admin() as admin:
        admin.call("drain")
        status, body = probe(port, "/readyz")
        assert status == 503 and "draining" in body
        assert probe(port, "/healthz")[0] == 200
        admin.call("resume")
    assert probe(port, "/readyz") == (200, "ready\n")


def test_a_hot_model_that_failed_to_load_keeps_the_daemon_unready(make_daemon, tmp_path) -> None:
    broken = tmp_path / "broken" / "1" / "model.onnx"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"this is not an ONNX model")
    port = free_port()
    make_daemon(f'[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n'
                f'[[models]]\nname = "broken"\nengine = "{broken}"\n',
                head=DAEMON_HEAD + f"metrics_port = {port}\n")
    status, body = probe(port, "/readyz")
    assert status == 503 and "broken:1 is failed" in body, body
    assert "addone" not in body  # only what stands in the way is named
    assert probe(port, "/healthz")[0] == 200


def test_a_cold_model_that_loads_on_demand_does_not_hold_readiness(make_daemon) -> None:
    port = free_port()
    make_daemon('[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n'
                '[[models]]\nname = "later"\nengine = "addone/2/model.onnx"\nplacement = "cold"\n',
                head=DAEMON_HEAD + f"metrics_port = {port}\n")
    assert probe(port, "/readyz") == (200, "ready\n")
