"""`infermux tune`: the sizing rule on canned measurements, and a real sweep against a daemon."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infermux.cli.tune import Recommendation, Step, frontend_note, judge, recommend

CLASSIFIER = """
[[models]]
name = "classifier"
engine = "classifier/1/model.onnx"
contexts = 2
max_queue = 256
"""


def steps(*rows: tuple[float, float]) -> list[Step]:
    return [Step(n, qps, p99) for n, (qps, p99) in enumerate(rows, 1)]


@pytest.mark.parametrize("rows, expected, why", [
    # 2 adds 80 % QPS; 3 adds 10 % QPS for +50 % p99: stop, keep 2.
    (((1000, 1000), (1800, 1100), (1980, 1650), (2000, 3000)), 2, "from 2 to 3 contexts added +10% QPS"),
    # the first step already trips the rule: one context.
    (((1000, 1000), (1100, 1300)), 1, "from 1 to 2"),
    # small QPS gain but p99 falls: not a stop; no stop anywhere -> the best QPS.
    (((1000, 1000), (1200, 900), (1250, 880)), 3, "no step up to 3"),
    # big p99 growth but QPS still +30 % or more: worth it, go on.
    (((1000, 1000), (1300, 2000)), 2, "no step up to 2"),
    # exactly +20 % p99 is not "more than 20 %".
    (((1000, 1000), (1050, 1200)), 2, "no step up to 2"),
    # the best QPS wins among counts that never tripped the rule; ties go to fewer contexts.
    (((1000, 1000), (1500, 1000), (1400, 1000), (1500, 1100)), 2, "2 gave the most QPS"),
    (((500, 800),), 1, "no step up to 1"),
])
def test_the_sizing_rule_on_canned_measurements(rows, expected, why) -> None:
    choice = recommend(steps(*rows))
    assert choice.contexts == expected and why in choice.reason, choice


def test_one_step_verdict_reports_growth() -> None:
    v = judge(Step(1, 1000, 1000), Step(2, 1290, 1210))
    assert v.stop and round(v.qps_growth, 2) == 0.29 and round(v.p99_growth, 2) == 0.21
    assert not judge(Step(1, 1000, 1000), Step(2, 1300, 5000)).stop


def test_no_measurements_is_an_error() -> None:
    with pytest.raises(ValueError):
        recommend([])


def test_the_recommendation_says_when_the_frontend_thread_was_the_limit() -> None:
    measured = [Step(1, 9000, 2000, frontend_busy=0.97), Step(2, 9100, 2600, frontend_busy=0.98),
                Step(3, 9000, 3100, frontend_busy=0.62)]
    note = frontend_note(measured, Recommendation(1, "..."))
    assert note == ("; the frontend thread was 97% busy there: that one thread, not the contexts, limits the QPS "
                    "(docs/operating.md, Sizing)")
    assert frontend_note(measured, Recommendation(3, "...")) == ""  # below 90 % at the count recommended
    assert frontend_note([Step(1, 9000, 2000)], Recommendation(1, "...")) == ""  # a daemon that does not say


def contexts(daemon) -> int:
    return next(m["contexts"] for m in daemon.admin().call("models")["models"] if m["name"] == "classifier")


def tune(daemon, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "infermux", "tune", "classifier", "--config", str(daemon.config_path),
           "--runtime-dir", str(daemon.run_dir), "--shape", "images=1x3x64x64", "--duration", "0.4",
           "--warmup", "20", "--max-contexts", "3", "--concurrency", "4", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_tune_sweeps_a_real_daemon_then_restores_or_applies(make_daemon) -> None:
    daemon = make_daemon(CLASSIFIER)
    out = tune(daemon)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "contexts" in lines[1] and "QPS" in lines[1] and "p99 ms" in lines[1] and "frontend" in lines[1]
    assert lines[2].split()[0] == "1" and float(lines[2].split()[1].replace(",", "")) > 0
    assert "recommend" in out.stdout and "restored 2" in out.stdout
    assert contexts(daemon) == 2  # put back as it was

    applied = tune(daemon, "--apply", "--json")
    assert applied.returncode == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert [s["contexts"] for s in result["steps"]][:2] == [1, 2]
    assert all(s["qps"] > 0 and s["errors"] == 0 for s in result["steps"])
    assert all(0 <= s["frontend_busy"] <= 1.05 for s in result["steps"])  # one thread: at most one core
    assert result["steps"][0]["frontend_busy"] > 0  # with one context it computes every request itself
    assert result["recommended"] == result["contexts_now"] == contexts(daemon)
    assert 1 <= result["recommended"] <= 3 and result["original"] == 2


def test_tune_explains_an_unknown_model(make_daemon) -> None:
    daemon = make_daemon(CLASSIFIER)
    out = subprocess.run([sys.executable, "-m", "infermux", "tune", "nope", "--config", str(daemon.config_path),
                          "--runtime-dir", str(daemon.run_dir), "--shape", "x=1x4"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "serves no model 'nope'" in out.stderr
