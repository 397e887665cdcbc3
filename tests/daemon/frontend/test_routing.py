"""Routing strategies, fallback chains and Retry-After, end to end."""

from __future__ import annotations

import time
from collections import Counter
from typing import Callable

import numpy as np
import pytest

from support.harness import Daemon
from support.polling import eventually

X4 = np.zeros((1, 4), np.float32)
BIG = np.ones((64, 512), np.float32)  # ~10 ms and more through the slow model on the 2-core box

TWO_VERSIONS = """
[routing]
strategy = "{strategy}"

[[models]]
name = "addone"
version = "1"
engine = "addone/1/model.onnx"
contexts = {contexts}
max_queue = 256
weight = 90

[[models]]
name = "addone"
version = "2"
engine = "addone/2/model.onnx"
contexts = {contexts}
max_queue = 256
weight = 10
"""


def send_many(d: Daemon, count: int, window: int = 32, **fields) -> list:
    """`count` requests to addone, `window` in flight at a time."""
    replies = []
    with d.pipeline() as pipe:
        for start in range(0, count, window):
            ids = [pipe.submit("addone", {"x": X4}, **fields) for _ in range(min(window, count - start))]
            replies += pipe.gather(ids)
    return replies


def served_by_context(d: Daemon) -> dict[tuple[str, str, int], int]:
    """(model, version, context index) -> requests served, from the admin socket."""
    with d.admin() as admin:
        views = admin.call("models")["models"]
    return {(v["name"], v["version"], i): c["served"]
            for v in views for i, c in enumerate(v["stats"]["contexts"])}


def in_flight(d: Daemon, name: str) -> int:
    """Requests of model `name` being computed right now, from the admin socket."""
    with d.admin() as admin:
        return sum(v["in_flight"] for v in admin.call("models")["models"] if v["name"] == name)


def counts_after(d: Daemon, before: dict, more: int) -> dict:
    """Per-context counts once `more` replies beyond `before` have been recorded.

    An executor records a reply just after sending it, so the admin socket
    may briefly lag the client; poll until the totals agree.
    """
    deadline = time.monotonic() + 30
    while True:
        now = served_by_context(d)
        if sum(now.values()) - sum(before.values()) >= more or time.monotonic() > deadline:
            return {k: now[k] - before.get(k, 0) for k in now if now[k] != before.get(k, 0)}
        time.sleep(0.01)


# -- weighted -------------------------------------------------------------------

def test_weighted_splits_traffic_by_weight_and_follows_new_weights(make_daemon):
    d = make_daemon(TWO_VERSIONS, strategy="weighted", contexts=1)
    replies = send_many(d, 2000)
    versions = Counter(r.version for r in replies)
    assert all(r.status == 200 for r in replies)
    # Binomial(2000, 0.1): mean 200, sd 13.4; ±60 is 4.5 sd.
    assert 140 <= versions["2"] <= 260, versions
    assert all(r.outputs["y"][0, 0] == float(r.version) for r in replies)  # v1 adds 1, v2 adds 2
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 1, "2": 1})
    versions = Counter(r.version for r in send_many(d, 1000))
    assert 400 <= versions["2"] <= 600, versions  # mean 500, sd 15.8
    with d.admin() as admin:
        admin.call("set", model="addone", weights={"1": 0, "2": 1})
    assert Counter(r.version for r in send_many(d, 200)) == {"2": 200}


def test_a_request_naming_a_version_is_never_split(make_daemon):
    d = make_daemon(TWO_VERSIONS, strategy="weighted", contexts=1)
    assert Counter(r.version for r in send_many(d, 200, version="1")) == {"1": 200}


# -- hash -----------------------------------------------------------------------

def test_hash_keeps_each_key_on_one_version_and_one_context(make_daemon):
    d = make_daemon(TWO_VERSIONS, strategy="hash", contexts=2)
    homes = set()
    for key in (f"cam-{i}" for i in range(10)):
        before = served_by_context(d)
        replies = send_many(d, 4, window=4, key=key)
        grew = counts_after(d, before, 4)
        assert len({r.version for r in replies}) == 1
        assert list(grew.values()) == [4], f"{key} spread over {grew}"  # one version, one context
        homes |= set(grew)
    assert {version for _, version, _ in homes} == {"1", "2"}  # keys do use both versions
    assert len(homes) >= 3


def test_adding_a_context_moves_only_the_keys_it_takes(make_daemon):
    d = make_daemon('[routing]\nstrategy = "hash"\n[[models]]\nname = "addone"\nengine = "addone/1/model.onnx"\n'
                    "contexts = 2\n")
    keys = [f"cam-{i}" for i in range(30)]

    def homes() -> dict[str, int]:
        where = {}
        for key in keys:
            before = served_by_context(d)
            send_many(d, 1, key=key)
            (home,) = counts_after(d, before, 1)
            where[key] = home[2]
        return where

    two = homes()
    with d.admin() as admin:
        admin.call("set", model="addone", contexts=3)
    three = homes()
    moved = [k for k in keys if two[k] != three[k]]
    assert set(two.values()) == {0, 1}
    assert all(three[k] == 2 for k in moved)  # a key moves only to the new context
    assert 3 <= len(moved) <= 18  # about a third of them


# -- least_queue ------------------------------------------------------------------

@pytest.mark.timing
def test_least_queue_sends_requests_to_the_idle_context(make_daemon):
    head = '[daemon]\nlisten = ["ipc://infer.sock"]\nengine_dir = "{engines}"\nmax_message_bytes = 16777216\n'
    d = make_daemon('[[models]]\nname = "slow"\nengine = "slow/1/model.onnx"\ncontexts = 2\n'
                    "timeout_ms = 30000\n", head=head)
    huge = np.ones((4000, 512), np.float32)  # keeps one context busy for half a second or more
    small = BIG[:1]
    before = served_by_context(d)
    with d.pipeline(timeout_s=60) as pipe, d.client() as client:
        busy = pipe.submit("slow", {"x": huge})
        # The big one is computing: only now is one context busy.
        eventually(lambda: in_flight(d, "slow") == 1, "the big request to start", 30, interval_s=0.005)
        quick = [client.infer("slow", {"x": small}) for _ in range(5)]
        assert pipe.result(busy).status == 200
    assert all(r.status == 200 for r in quick)
    grew = counts_after(d, before, 6)
    assert sorted(grew.values()) == [1, 5], grew  # the big one alone on one context, the rest on the other


def test_a_request_naming_no_version_goes_to_the_default_under_least_queue(make_daemon):
    d = make_daemon(TWO_VERSIONS, strategy="least_queue", contexts=1)
    assert Counter(r.version for r in send_many(d, 100)) == {"2": 100}  # never spread over versions


# -- fallback chains ----------------------------------------------------------------

CHAIN = """
[[models]]
name = "a"
engine = "slow/1/model.onnx"
max_queue = 1
timeout_ms = 10000
fallback = "b"

[[models]]
name = "b"
engine = "slow/1/model.onnx"
max_queue = 1
timeout_ms = 10000
fallback = "c"

[[models]]
name = "c"
engine = "fast512/1/model.onnx"
max_queue = 64
"""


def test_a_full_queue_follows_the_chain_to_the_end(make_daemon):
    d = make_daemon(CHAIN)
    with d.pipeline() as pipe:
        replies = pipe.gather([pipe.submit("a", {"x": BIG}) for _ in range(12)])
    assert all(r.status == 200 for r in replies)
    served = Counter(r.model for r in replies)
    assert set(served) == {"a", "b", "c"}, served
    for r in replies:
        if r.model == "a":
            assert r.fallback is None
        else:
            assert r.fallback == {"from": "a", "reason": "queue_full"}
    np.testing.assert_array_equal(next(r for r in replies if r.model == "c").outputs["y"], BIG)


def test_not_ready_follows_the_chain_to_its_depth_limit(make_daemon):
    loading = ('[[models]]\nname = "{name}"\nengine = "fast512/1/model.onnx"\nfallback = "{next}"\n'
               'backend = "slow_load:SlowLoadBackend"\n[models.options]\nload_delay_s = 30\n')
    names = ["m0", "m1", "m2", "m3", "m4"]  # four hops: config.MAX_FALLBACK_DEPTH
    toml = "".join(loading.replace("{name}", a).replace("{next}", b) for a, b in zip(names, names[1:]))
    d = make_daemon(toml + '[[models]]\nname = "m4"\nengine = "fast512/1/model.onnx"\n', wait_ready=False)
    d.wait_for("loaded model=m4 ")
    with d.client() as client:
        reply = client.infer("m0", {"x": BIG[:1]})
        middle = client.infer("m2", {"x": BIG[:1]})
    assert reply.status == 200 and reply.model == "m4"
    assert reply.fallback == {"from": "m0", "reason": "not_ready"}
    assert middle.model == "m4" and middle.fallback == {"from": "m2", "reason": "not_ready"}


@pytest.mark.timing
def test_a_late_request_goes_to_the_fallback_instead_of_504(make_daemon):
    d = make_daemon(CHAIN.replace("max_queue = 1\n", "max_queue = 8\n"))
    with d.pipeline(timeout_s=30) as pipe:
        # Four long computes ahead of the 5 ms request: it is late when taken even if this client
        # is held off the CPU for a while after the first.
        first = [pipe.submit("a", {"x": np.ones((400, 512), np.float32)}) for _ in range(4)]
        late = pipe.submit("a", {"x": BIG[:1]}, timeout_ms=5)
        replies = pipe.gather([*first, late])
    assert all(r.status == 200 and r.model == "a" for r in replies[:4]), [r.header for r in replies[:4]]
    assert replies[4].status == 200 and replies[4].model in ("b", "c"), replies[4].header
    assert replies[4].fallback == {"from": "a", "reason": "deadline"}


def test_a_fallback_cycle_is_a_configuration_error(make_daemon):
    cycle = CHAIN.replace('engine = "fast512/1/model.onnx"\n', 'engine = "fast512/1/model.onnx"\nfallback = "a"\n')
    with pytest.raises(AssertionError, match="fallback cycle: .*a -> b -> c -> a"):
        make_daemon(cycle)


# -- Retry-After ------------------------------------------------------------------

def retry_hints(d: Daemon, burst: int) -> list[int]:
    with d.pipeline() as pipe:
        replies = pipe.gather([pipe.submit("slow", {"x": BIG}) for _ in range(burst)])
    return sorted(r.retry_after_ms for r in replies if r.status == 429)


@pytest.mark.timing
def test_retry_after_grows_with_the_queue_depth(make_daemon):
    d = make_daemon('[[models]]\nname = "slow"\nengine = "slow/1/model.onnx"\nmax_queue = 2\ntimeout_ms = 10000\n')
    with d.client() as client:
        for _ in range(3):  # the service time Retry-After is computed from
            assert client.infer("slow", {"x": BIG}).status == 200
    shallow = retry_hints(d, 8)
    with d.admin() as admin:
        admin.call("set", model="slow", max_queue=8)
    deep = retry_hints(d, 20)
    assert shallow and deep and min(shallow) >= 1
    median: Callable[[list[int]], int] = lambda xs: xs[len(xs) // 2]  # noqa: E731
    # (queued rows + 1) × time per row: 8 queued requests against 2, plus the one running.
    assert median(deep) > 2 * median(shallow), (shallow, deep)


def test_a_pipeline_steps_unnamed_tensor_takes_the_input_name_of_the_version_it_is_routed_to() -> None:
    """A pipeline's step names its tensor when it sends it; while the model loads it cannot, and the
    version may be ready by the time the router chooses it (a stress round caught the 400 this was)."""
    from pathlib import Path
    from types import SimpleNamespace
    from typing import Any

    from infermux.config import Config, DaemonConfig, RoutingConfig
    from infermux.plugins.base import TensorSpec
    from infermux.protocol import ProtocolError, Request
    from infermux.execution.job import ONLY_INPUT, Internal, Job, ReplyTo
    from infermux.frontend.router import Router

    registry: Any = SimpleNamespace()
    router = Router(registry, Config(Path("t.toml"), DaemonConfig(), RoutingConfig(), models=()), lambda *args: None)
    version: Any = SimpleNamespace(name="cls", engine=SimpleNamespace(
        inputs=[TensorSpec("images", "float32", (-1, 4))], outputs=[]))
    x = np.zeros((1, 4), np.float32)

    def job(name: str, internal: bool) -> Job:
        to: ReplyTo = Internal(SimpleNamespace(deliver=lambda *a: None)) if internal else [b"peer"]
        return Job(to, Request(model="cls", inputs={name: x}), [], 0, 0)

    step = job(ONLY_INPUT, internal=True)
    router._check_tensors(version, step)
    assert list(step.request.inputs) == ["images"] and step.request.inputs["images"] is x
    for wrong in (job(ONLY_INPUT, internal=False), job("input", internal=True)):  # only the placeholder, only inside
        with pytest.raises(ProtocolError, match=r"takes inputs \['images'\]"):
            router._check_tensors(version, wrong)
