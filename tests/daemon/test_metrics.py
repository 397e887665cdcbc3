"""Prometheus exposition: a scrape parses, and its counters move with traffic."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import numpy as np
import pytest

from support.harness import DAEMON_HEAD, REPO, free_port
from support.metrics import scrape

def exposed_names(port: int) -> set[str]:
    """Every family a scrape declares and every sample name in it (`..._bucket` and the like)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    return declared | {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}


def dashboard_metric_names() -> set[str]:
    """The infermux_* names in every query of the shipped Grafana dashboard (panels and variables)."""
    dashboard = json.loads((REPO / "packaging/grafana/infermux.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return {name for query in queries for name in re.findall(r"\binfermux_[a-z0-9_]+", query)}


@pytest.fixture
def port_and_daemon(make_daemon):
    port = free_port()
    head = DAEMON_HEAD + f"metrics_port = {port}\n"
    d = make_daemon('[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\nmax_batch = 4\n', head=head)
    return port, d


def test_counters_move_with_traffic(port_and_daemon) -> None:
    port, d = port_and_daemon
    labels = '{model="addone",version="1"}'
    before = scrape(port)
    assert before[f"infermux_inference_request_success_total{labels}"] == 0
    with d.client() as client:
        for _ in range(5):
            assert client.infer("addone", {"x": np.ones((1, 4), np.float32)}).status == 200
        assert client.infer("addone", {"x": np.ones((1, 5), np.float32)}).status == 400
    after = scrape(port)
    assert after[f"infermux_inference_request_success_total{labels}"] == 5
    assert after['infermux_inference_request_failure_total{model="addone",version="1",reason="bad_request"}'] == 1
    assert after['infermux_inference_request_duration_us_count{model="addone",version="1"}'] == 5
    assert after['infermux_inference_request_duration_us_bucket{model="addone",version="1",le="+Inf"}'] == 5
    assert after[f"infermux_inference_compute_duration_us_total{labels}"] > 0
    assert after['infermux_model_state{model="addone",version="1",state="ready"}'] == 1
    assert after["infermux_memory_budget_bytes"] > 0


def test_only_metrics_is_served_and_only_on_loopback(port_and_daemon) -> None:
    port, d = port_and_daemon
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    assert info.value.code == 404
    assert f"http://127.0.0.1:{port}/metrics" in d.log()


def test_every_metric_the_dashboard_queries_is_exposed(make_daemon) -> None:
    port = free_port()
    make_daemon('[[models]]\nname = "hot"\nengine = "addone/1/model.onnx"\n'
                '[[models]]\nname = "cold"\nengine = "addone/2/model.onnx"\nmode = "multiproc"\npreload = true\n',
                head=DAEMON_HEAD + f"metrics_port = {port}\n")
    wanted = dashboard_metric_names()
    assert {"infermux_inference_request_duration_us_bucket", "infermux_gpu_utilization_ratio",
            "infermux_worker_restarts_total", "infermux_model_swaps_total"} <= wanted  # the queries were read
    assert sorted(wanted - exposed_names(port)) == []


def test_the_package_installs_the_dashboard() -> None:
    install = (REPO / "debian/infermux.install").read_text().splitlines()
    assert "packaging/grafana/infermux.json usr/share/infermux/grafana/" in install
    assert dashboard_metric_names()  # and it is JSON with queries in it
