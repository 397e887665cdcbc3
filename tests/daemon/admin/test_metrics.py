"""Prometheus exposition: a scrape parses, and its counters move with traffic."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from support.harness import DAEMON_HEAD, REPO, free_port
from support.metrics import scrape

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
    assert after['infermux_inference_request_duration_seconds_count{model="addone",version="1"}'] == 5
    assert after['infermux_inference_request_duration_seconds_bucket{model="addone",version="1",le="+Inf"}'] == 5
    assert after[f"infermux_inference_compute_duration_seconds_total{labels}"] > 0
    assert before[f"infermux_inference_executions_total{labels}"] == 0
    assert after[f"infermux_inference_executions_total{labels}"] == sum(
        n for k, n in after.items() if k.startswith('infermux_inference_batches_total{model="addone"'))
    assert after['infermux_model_state{model="addone",version="1",state="ready"}'] == 1
    assert after["infermux_memory_budget_bytes"] > 0
    # The five like requests: the first seen, the second kept as a layout, three read from it.
    assert (before["infermux_headers_from_layout_total"], after["infermux_headers_from_layout_total"]) == (0, 3)
    # Of those three, the express lane may have taken the last two (the third taught it their acceptance),
    # unless the inline gate sent them down the general path.
    assert before["infermux_express_requests_total"] == 0 and after["infermux_express_requests_total"] <= 2
    # The frontend thread (the daemon's main thread: its start-up counts too) is charged its CPU.
    assert after["infermux_frontend_thread_cpu_seconds_total"] >= before["infermux_frontend_thread_cpu_seconds_total"] > 0


def test_the_status_says_how_busy_the_frontend_thread_was_between_reads(port_and_daemon) -> None:
    import time

    _, d = port_and_daemon
    with d.admin() as admin:
        first = admin.call("status")["daemon"]["frontend_thread"]
        time.sleep(1.1)  # the share of a core is measured over at least a second (admin/threadload.py)
        second = admin.call("status")["daemon"]["frontend_thread"]
    assert second["cpu_s"] >= first["cpu_s"] > 0
    assert second["over_s"] >= 1.0 and 0 <= second["busy_ratio"] <= 1.05  # one thread: at most one core


def test_only_metrics_is_served_and_only_on_loopback(port_and_daemon) -> None:
    port, d = port_and_daemon
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    assert info.value.code == 404
    assert f"http://127.0.0.1:{port}/metrics" in d.log()


def test_counters_start_at_zero_so_their_first_increase_is_seen(make_daemon) -> None:
    # A counter that first appears at 1 hides that increase from rate() and increase(): the first
    # 429 burst or worker crash would never reach an alert. Every reason, every cold version's
    # restarts and every model's swaps are exposed at 0 before anything happens.
    port = free_port()
    make_daemon('[[models]]\nname = "hot"\nengine = "addone/1/model.onnx"\nmax_queue = 7\n'
                '[[models]]\nname = "cold"\nengine = "addone/2/model.onnx"\nplacement = "cold"\npreload = true\n',
                head=DAEMON_HEAD + f"metrics_port = {port}\n")
    samples = scrape(port)
    for model, version in (("hot", "1"), ("cold", "1")):
        for reason in ("bad_request", "not_found", "too_large", "queue_full", "backend_error", "not_ready", "deadline"):
            labels = f'model="{model}",version="{version}",reason="{reason}"'
            assert samples[f"infermux_inference_request_failure_total{{{labels}}}"] == 0
        assert samples[f'infermux_model_swaps_total{{model="{model}"}}'] == 0
    assert samples['infermux_worker_restarts_total{model="cold",version="1"}'] == 0
    assert not any(k.startswith('infermux_worker_restarts_total{model="hot"') for k in samples)  # no worker
    assert samples['infermux_inference_max_queue{model="hot",version="1"}'] == 7
    assert samples['infermux_inference_queued_requests{model="hot",version="1"}'] == 0


def test_durations_are_in_seconds() -> None:
    # `promtool check metrics` rejects abbreviated units (_us): the daemon counts µs, the exposition says s.
    from infermux.admin.metrics import _histogram, Exposition

    out = Exposition()
    stats = {"latency_le_us": {"100": 2, "2500": 1, "+Inf": 1}, "sums_us": {"total": 1_500_250.0}}
    _histogram(out, [{"name": "m", "version": "1", "stats": stats}], lambda m: {"model": "m", "version": "1"})
    lines = out.text().splitlines()
    assert 'infermux_inference_request_duration_seconds_bucket{model="m",version="1",le="0.0001"} 2' in lines
    assert 'infermux_inference_request_duration_seconds_bucket{model="m",version="1",le="0.0025"} 3' in lines
    assert 'infermux_inference_request_duration_seconds_bucket{model="m",version="1",le="10"} 3' in lines
    assert 'infermux_inference_request_duration_seconds_bucket{model="m",version="1",le="+Inf"} 4' in lines
    assert 'infermux_inference_request_duration_seconds_sum{model="m",version="1"} 1.50025' in lines


def test_sample_values_keep_full_precision() -> None:
    # A cumulative seconds counter past 10^6 s must still move by milliseconds, or rate() sees steps.
    from infermux.admin.metrics import Exposition

    out = Exposition()
    out.family("x_seconds_total", "counter", "x", [({}, 1234567.891), ({"a": "b"}, float("inf")), ({"a": "c"}, 3)])
    assert out.text().splitlines()[2:] == ["x_seconds_total 1234567.891", 'x_seconds_total{a="b"} +Inf',
                                           'x_seconds_total{a="c"} 3']


def test_the_package_installs_the_dashboard() -> None:
    install = (REPO / "debian/infermux.install").read_text().splitlines()
    assert "packaging/grafana/infermux.json usr/share/infermux/grafana/" in install
    assert json.loads((REPO / "packaging/grafana/infermux.json").read_text())["panels"]
