"""Every 500 is counted where operators look, and a repeated traceback is logged once, then counted.

A real plugin (tests/support/fakes/plugins/bad_outputs.py) returns outputs the wire cannot
carry for a negative input, so each such request is answered 500 by the
executor's guard: the path a broken third-party backend takes.
"""

from __future__ import annotations

import io
import logging
import re
import urllib.request

import numpy as np

from support.harness import DAEMON_HEAD, free_port
from infermux.events import EventLog, TracebackLimiter

BAD = '[[models]]\nname = "bad"\nengine = "addone/1/model.onnx"\nbackend = "bad_outputs:BadOutputsBackend"\n'
FAILING = 40


def test_repeated_500s_are_counted_everywhere_and_their_traceback_logged_once(make_daemon) -> None:
    port = free_port()
    # No interval closes during the test: the count comes in one line, at exit.
    head = DAEMON_HEAD + f"metrics_port = {port}\ntraceback_interval_s = 3600\n"
    d = make_daemon(BAD, head=head)
    with d.client() as client:
        statuses = [client.infer("bad", {"x": -np.ones((1, 4), np.float32)}).status for _ in range(FAILING)]
        assert client.infer("bad", {"x": np.ones((1, 4), np.float32)}).status == 200
    assert statuses == [500] * FAILING
    with d.admin() as admin:
        (row,) = admin.call("models")["models"]
        daemon = admin.call("status")["daemon"]
        events = [e for e in admin.call("events")["events"] if e["kind"] == "error"]
    assert row["stats"]["by_status"] == {"200": 1, "500": FAILING}
    assert daemon["internal_errors"] == FAILING
    assert [(e["model"], e["version"]) for e in events] == [("bad", "1")]
    assert "dtype object" in events[0]["reason"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert f'infermux_inference_request_failure_total{{model="bad",version="1",reason="backend_error"}} {FAILING}' \
        in metrics.splitlines()
    assert f"infermux_internal_errors_total {FAILING}" in metrics.splitlines()
    assert d.stop() == 0
    log = d.log()
    assert log.count("Traceback") == 1, log
    (count,) = re.findall(r"executor error model=bad .*: (\d+) more like this", log)
    assert int(count) == FAILING - 1


def _limited(interval_s: float = 3600.0) -> tuple[logging.Logger, io.StringIO, TracebackLimiter, EventLog]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    limiter = TracebackLimiter(interval_s)
    limiter.events = EventLog()
    handler.addFilter(limiter)
    logger = logging.getLogger(f"test.limiter.{id(limiter)}")
    logger.propagate = False
    logger.addHandler(handler)
    return logger, out, limiter, limiter.events


def _fail(logger: logging.Logger, message: str, exc: Exception) -> None:
    try:
        raise exc
    except Exception:
        logger.exception(message)


def test_the_limiter_passes_one_of_each_kind_and_counts_the_rest() -> None:
    logger, out, limiter, events = _limited()
    for _ in range(5):
        _fail(logger, "executor error model=a version=1 context=0", ValueError("boom"))
    _fail(logger, "executor error model=b version=2 context=0", ValueError("boom"))
    _fail(logger, "executor error model=a version=1 context=0", KeyError("other"))
    logger.warning("a line without a traceback is never held back")
    assert out.getvalue().count("Traceback") == 3 and limiter.total == 7
    assert "never held back" in out.getvalue()
    limiter.flush()
    assert "executor error model=a version=1 context=0: ValueError: boom: 4 more like this" in out.getvalue()
    kinds = [(e.model, e.version, e.detail.get("repeated", 0)) for e in events.recent() if e.kind == "error"]
    assert kinds == [("a", "1", 0), ("b", "2", 0), ("a", "1", 0), ("a", "1", 4)]
    assert [e.kind for e in events.recent()].count("log") == 1  # the plain warning: the console's Log tab


def test_a_warning_with_an_exception_is_one_line_naming_it_then_counts() -> None:
    logger, out, limiter, _ = _limited()
    for _ in range(3):
        try:
            raise RuntimeError("engine lost")
        except RuntimeError:
            logger.warning("inference failed model=m version=1 context=0", exc_info=True)
    limiter.flush()
    assert "Traceback" not in out.getvalue() and limiter.total == 3
    assert out.getvalue().splitlines() == [
        "inference failed model=m version=1 context=0: RuntimeError: engine lost",
        "inference failed model=m version=1 context=0: RuntimeError: engine lost: 2 more like this "
        "(the first is above)"]


def test_after_a_flush_the_next_of_a_kind_shows_its_traceback_again() -> None:
    logger, out, limiter, _ = _limited()
    _fail(logger, "failed", ValueError("x"))
    limiter.flush()
    _fail(logger, "failed", ValueError("x"))
    assert out.getvalue().count("Traceback") == 2 and limiter.total == 2
