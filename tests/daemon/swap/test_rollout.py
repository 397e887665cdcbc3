"""Shadow rollout against a real daemon (docs/hot-swap.md#shadow-rollout): a published version of a model
with `[models.rollout]` is a candidate, computed on copies of live requests and compared, and serves only
once it agreed; no client ever gets a candidate's answer."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from infermux.client import Reply
from support import models
from support.harness import Daemon
from support.polling import eventually
from support.publish import publish, wait_served, watching
from support.traffic import Traffic

ROLLOUT = """
placement = "{placement}"
max_queue = {max_queue}
timeout_ms = 30000
[rollout]
shadow_requests = {n}
compare = "{compare}"
min_agreement = 0.99
min_idle_cpu = {min_idle_cpu}
max_latency_ratio = 0
{rollout_extra}"""


@pytest.fixture
def start(tmp_path: Path, root: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def run(n: int = 20, placement: str = "hot", compare: str = "allclose", extra: str = "",
            max_queue: int = 256, min_idle_cpu: float = 0, rollout_extra: str = "") -> Daemon:
        # min_idle_cpu 0: the shared test box is seldom idle, and these tests need their comparisons;
        # the CPU gate has tests of its own below. max_latency_ratio 0: a nice-19 candidate's p99 on a
        # busy box says more about the box than the engine (test_rollout_life.py judges a slow one).
        (root / "m").mkdir(exist_ok=True)
        (root / "m" / "model.toml").write_text(extra + ROLLOUT.format(n=n, placement=placement, compare=compare,
                                                                      max_queue=max_queue, min_idle_cpu=min_idle_cpu,
                                                                      rollout_extra=rollout_extra))
        workdir = tmp_path / f"daemon{len(started)}"
        workdir.mkdir()
        daemon = Daemon(workdir, watching(root))
        started.append(daemon)
        return daemon.start()

    yield run
    for daemon in started:
        assert daemon.stop() == 0, daemon.log()


def cli(daemon: Daemon, *argv: str) -> subprocess.CompletedProcess:
    """`infermux ARGV` against this daemon's admin socket, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "infermux", *argv, "-e", daemon.admin_endpoint], text=True,
                          capture_output=True, timeout=60)


def events(daemon: Daemon, kind: str) -> list[str]:
    return [line for line in daemon.log().splitlines() if f"infermux.events: {kind} " in line]


def versions_status(daemon: Daemon) -> dict[str, list[dict]]:
    with daemon.admin() as admin:
        rows = admin.call("models")["models"]
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["version"], []).append(row)
    return out


@pytest.mark.parametrize("placement", ["hot", "cold"])
def test_an_identical_candidate_serves_after_exactly_its_shadow_requests_and_no_client_saw_it_before(
        root: Path, start: Callable[..., Daemon], placement: str) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=20, placement=placement)
    wait_served(daemon, "m", "1", offset=1, timeout=30)
    publish(root, "m", 2, offset=1)  # the same answers
    daemon.wait_for("rollout_started model=m version=2", 30)
    # No request has come yet, so the candidate waits in its rollout however fast mirroring would go.
    (shadowing,) = versions_status(daemon)["2"]
    assert shadowing["state"] == "candidate" and "shadowing: 0/20 compared" in shadowing["reason"], shadowing
    assert shadowing["rollout"]["compared"] == 0, shadowing
    with Traffic(daemon, "m") as traffic:
        daemon.wait_for("rollout_passed model=m version=2", 60)
        traffic.saw("2")
    (passed,) = events(daemon, "rollout_passed")
    assert "compared=20 " in passed + " " and "agreement=1.0" in passed
    served = [reply.version for reply in traffic.replies]
    assert all(reply.status == 200 for reply in traffic.replies)
    first_two = served.index("2")
    assert set(served[:first_two]) == {"1"} and set(served[first_two:]) == {"2"}  # never back to 1
    for reply, x in traffic.sent:
        np.testing.assert_array_equal(reply.outputs["y"], x + 1)
    daemon.wait_for("unloaded model=m version=1", 30)


def test_a_perturbed_candidate_is_refused_and_never_answers_a_client(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=15)
    wait_served(daemon, "m", "1", offset=1)
    with Traffic(daemon, "m") as traffic:
        publish(root, "m", 2, offset=1.5)
        daemon.wait_for("rollout_failed model=m version=2", 60)
    (failed,) = events(daemon, "rollout_failed")  # at the first disagreement: 14 more could not make 99%
    assert "agreement=0.0 compared=1 " in failed and "inputs=\"x float32[2,4]\"" in failed and "|Δ| 0.5" in failed
    assert all(reply.status == 200 and reply.version == "1" for reply in traffic.replies)
    for reply, x in traffic.sent:
        np.testing.assert_array_equal(reply.outputs["y"], x + 1)
    (row,) = versions_status(daemon)["2"]
    assert row["state"] == "failed" and ("rollout failed: it can no longer reach min_agreement: 0 of 1 compared "
                                         "agree, so at most 93.33% of 15, 99.00% needed") in row["reason"], row
    assert "worst: output 'y': |Δ| 0.5" in row["reason"]
    wait_served(daemon, "m", "1", offset=1)


def test_argmax_passes_a_candidate_whose_scores_move_but_whose_top_class_does_not(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=10, compare="argmax")
    wait_served(daemon, "m", "1", offset=1)
    with Traffic(daemon, "m") as traffic:
        publish(root, "m", 2, offset=1.5)  # every score 0.5 higher: allclose refuses it (above), argmax not
        daemon.wait_for("rollout_passed model=m version=2", 60)
        traffic.saw("2")
    (passed,) = events(daemon, "rollout_passed")
    assert "agreement=1.0 compared=10" in passed
    for reply, x in traffic.sent:
        np.testing.assert_array_equal(reply.outputs["y"], x + (1.5 if reply.version == "2" else 1))


def boxes(rng: np.random.Generator) -> np.ndarray:
    """Two 10 x 10 boxes [x0, y0, x1, y1] somewhere on a 100 x 100 image."""
    corner = rng.uniform(0, 90, (2, 2)).astype(np.float32)
    return np.concatenate([corner, corner + 10], axis=1)


@pytest.mark.parametrize(("offset", "verdict"), [(1, "rollout_passed"), (8, "rollout_failed")])
def test_iou_judges_a_detector_by_how_far_its_boxes_moved(root: Path, start: Callable[..., Daemon], offset: float,
                                                          verdict: str) -> None:
    publish(root, "m", 1, offset=0)  # the model's answer read as boxes: the input boxes, moved by `offset`
    daemon = start(n=10, compare="iou", rollout_extra="iou = 0.5\n")
    wait_served(daemon, "m", "1", offset=0)
    with Traffic(daemon, "m", inputs=boxes) as traffic:
        publish(root, "m", 2, offset=offset)  # 1 along both axes: IoU 0.68 (81/119); 8: 0.02 (4/196)
        daemon.wait_for(f"{verdict} model=m version=2", 60)
    (event,) = events(daemon, verdict)
    assert f"compared={10 if verdict == 'rollout_passed' else 1} " in event + " ", event  # refused at its first miss
    if verdict == "rollout_failed":
        assert "best overlap" in event and all(reply.version == "1" for reply in traffic.replies), event


def test_a_replaced_file_of_the_serving_version_is_a_candidate_too(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=10)
    wait_served(daemon, "m", "1", offset=1)
    with Traffic(daemon, "m"):
        publish(root, "m", 1, offset=3)  # the serving version's own file, answering otherwise
        daemon.wait_for("rollout_failed model=m version=1", 60)
    (row,) = versions_status(daemon)["1"]
    assert row["state"] == "ready" and "new engine file rejected (rollout failed" in row["reason"]
    wait_served(daemon, "m", "1", offset=1)


def test_an_operator_decides_early(root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=100000)  # never decides by itself
    wait_served(daemon, "m", "1", offset=1)
    publish(root, "m", 2, offset=7)
    daemon.wait_for("rollout_started model=m version=2", 30)
    with Traffic(daemon, "m"):  # comparisons to show
        eventually(lambda: versions_status(daemon)["2"][0]["rollout"]["compared"] >= 2, "comparisons", 30)
    status = cli(daemon, "status")
    assert status.returncode == 0 and re.search(r"m\s+2\s+cold\s+candidate", status.stdout), status.stdout
    assert re.search(r"m:2: shadowing: \d+/100000 compared, 0\.00% agree \(needs 99\.00%\)", status.stdout)
    models_out = cli(daemon, "ctl", "models").stdout
    assert "m:2  (cold, candidate)" in models_out and "shadowing: " in models_out, models_out
    wrong = cli(daemon, "ctl", "reject", "m", "1")
    assert wrong.returncode == 1 and wrong.stderr.strip() == (
        "infermux ctl reject: m:1 is not a candidate (its candidate is version 2)"), wrong.stderr
    promoted = cli(daemon, "ctl", "promote-now", "m", "2")
    assert promoted.returncode == 0 and "m:2 serves (promoted after" in promoted.stdout, promoted.stderr
    wait_served(daemon, "m", "2", offset=7)
    assert "rollout_passed model=m version=2" in daemon.log() and 'reason="promoted by an operator"' in daemon.log()
    publish(root, "m", 3, offset=1)
    daemon.wait_for("rollout_started model=m version=3", 30)
    with daemon.admin() as admin:
        admin.call("reject", model="m", version="3")
    assert "rejected by an operator" in versions_status(daemon)["3"][0]["reason"]
    wait_served(daemon, "m", "2", offset=7)


def test_mirroring_under_overload_never_turns_a_clients_200_into_anything_else(
        root: Path, start: Callable[..., Daemon]) -> None:
    models.slow(root / "m" / ".1" / "model.onnx", layers=12, width=512)
    (root / "m" / ".1").rename(root / "m" / "1")
    daemon = start(n=100000, extra="contexts = 1\n")
    with daemon.client() as client:
        eventually(lambda: client.infer("m", {"x": np.ones((1, 512), np.float32)}).status == 200, "served", 30)
    models.slow(root / "m" / ".2" / "model.onnx", layers=12, width=512)
    (root / "m" / ".2").rename(root / "m" / "2")
    daemon.wait_for("rollout_started model=m version=2", 30)
    statuses: list[int] = []
    paused = threading.Event()

    def client_loop() -> None:  # until mirroring has paused (a liveness bound, not a timing outcome)
        with daemon.pipeline(timeout_s=60) as client:
            for _ in range(200):
                idents = [client.submit("m", {"x": np.ones((4, 512), np.float32)}) for _ in range(12)]
                statuses.extend(reply.status for reply in client.gather(idents))
                if paused.is_set() or "rollout_paused model=m version=2" in daemon.log():
                    paused.set()
                    return

    clients = [threading.Thread(target=client_loop) for _ in range(4)]  # 48 in flight: far more than it computes
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(120)
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    assert "rollout_paused model=m version=2" in daemon.log()  # it waited for the serving version
    (row,) = versions_status(daemon)["2"]
    assert row["state"] == "candidate" and row["rollout"]["not_mirrored"] > 0


def test_answers_a_fallback_gave_are_not_held_against_the_candidate(root: Path, start: Callable[..., Daemon]) -> None:
    models.add_one(root / "fb" / ".1" / "model.onnx", width=512, offset=9)  # answers otherwise than m
    (root / "fb" / ".1").rename(root / "fb" / "1")
    for version in ("1", "2"):  # 2: the same engine as 1, published once 1 serves
        models.slow(root / "m" / f".{version}" / "model.onnx", layers=12, width=512)
    (root / "m" / ".1").rename(root / "m" / "1")
    daemon = start(n=100000, max_queue=2, extra='contexts = 1\nfallback = "fb"\n')  # never decides by itself
    x = np.ones((4, 512), np.float32)
    with daemon.client() as client:
        eventually(lambda: client.infer("m", {"x": x}).status == 200 and client.infer("fb", {"x": x}).status == 200,
                   "m and fb served", 30)
    (root / "m" / ".2").rename(root / "m" / "2")
    daemon.wait_for("rollout_started model=m version=2", 30)
    replies: list[Reply] = []

    def compared() -> int:
        return versions_status(daemon)["2"][0]["rollout"]["compared"]

    with daemon.pipeline(timeout_s=60) as client:
        for _ in range(300):  # bursts past m's queue, so that fb answers some, until both were seen
            replies.extend(client.gather([client.submit("m", {"x": x}) for _ in range(16)]))
            if any(r.fallback for r in replies) and compared() >= 10:
                break
    (row,) = versions_status(daemon)["2"]
    rollout = row["rollout"]
    assert row["state"] == "candidate" and rollout["compared"] >= 10, row
    assert rollout["agreed"] == rollout["compared"] and not rollout["worst"], row
    by_fallback = [r for r in replies if r.fallback]
    assert by_fallback and all(r.status == 200 and r.model == "fb" for r in by_fallback), by_fallback[:1]
    assert any(r.status == 200 and not r.fallback for r in replies)


def test_mirroring_waits_while_the_cpus_have_less_idle_time_than_min_idle_cpu(
        root: Path, start: Callable[..., Daemon]) -> None:
    publish(root, "m", 1, offset=1)
    daemon = start(n=5, min_idle_cpu=1.0)  # never met while anything runs: it must wait throughout
    wait_served(daemon, "m", "1", offset=1)
    with Traffic(daemon, "m") as traffic:
        publish(root, "m", 2, offset=1)
        daemon.wait_for('rollout_paused model=m version=2 reason="the CPUs are busy (', 30)
        eventually(lambda: len(traffic.replies) > 50, "requests while it waits", 30)
    (row,) = versions_status(daemon)["2"]
    assert row["state"] == "candidate" and row["rollout"]["compared"] == 0, row
    assert "mirroring paused: the CPUs are busy" in row["reason"] and "100% needed" in row["reason"]
    assert all(reply.status == 200 and reply.version == "1" for reply in traffic.replies)
