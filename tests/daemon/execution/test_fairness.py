"""Per-key fairness end to end: a flooding key does not starve the others.

The flood and the other camera share one DEALER, so the daemon receives
them in a known order; what we look at is the order the replies come back.
"""

from __future__ import annotations

import numpy as np
import pytest

BIG = np.ones((64, 512), np.float32)
# Over 100 ms per call through the slower model (48 layers): the whole flood and the camera are
# queued before the first is done, even if the client is held off the CPU for a while.
HEAVY = np.ones((256, 512), np.float32)
pytestmark = pytest.mark.timing


def model(contexts: int) -> str:
    return (f'[[models]]\nname = "slow"\nengine = "slower/1/model.onnx"\ncontexts = {contexts}\n'
            "max_queue = 64\ntimeout_ms = 20000\n")


def arrival_of_the_camera(d, flood: int, flood_key: str | None, camera_key: str | None) -> int:
    """Send `flood` requests, then one from the camera; where the camera's reply arrives (1 = first)."""
    with d.pipeline(timeout_s=30) as pipe:
        for _ in range(flood):
            pipe.submit("slow", {"x": HEAVY}, key=flood_key)
        camera = pipe.submit("slow", {"x": BIG[:1]}, key=camera_key)
        order = [r.header["id"] for r in pipe.replies()]
    return order.index(camera) + 1


def test_a_camera_does_not_wait_behind_a_flooding_key(make_daemon):
    d = make_daemon(model(contexts=1))
    # Served in turn: the flood request running, at most one more of the flood, then the camera.
    assert arrival_of_the_camera(d, 10, "flood", "camera") <= 3
    # Without keys both share one lane and the camera waits for the whole flood: what fairness prevents.
    assert arrival_of_the_camera(d, 10, None, None) == 11


def test_fairness_holds_with_least_queue_over_several_contexts(make_daemon):
    d = make_daemon(model(contexts=2))
    # The flood spreads over both contexts, five each; the camera joins one of them and takes its turn
    # there: it waits for the flood request running on that context, not for the four queued behind it.
    # Its reply says when it started; the flood's say when theirs did (all eleven were received in one
    # burst). So count the flood requests that started before the camera: the one running on each
    # context, and all five of the other context's if the camera's context is held off the CPU
    # meanwhile (a 1 s compute on a busy CI box), plus at most one taken just before the camera arrived.
    # Had it queued behind the flood, the five of its own context would be ahead of it too: nine or ten.
    # (Durations say nothing here: one starved compute makes a fair wait look like a long one.)
    ahead, timings = started_before_the_camera(d, flood_key="flood", camera_key="camera")
    assert ahead <= 7, f"{ahead} of the flood started before the camera; (queue, compute) ms: {timings}"


def started_before_the_camera(d, flood_key: str | None, camera_key: str | None) -> tuple[int, str]:
    """Send a flood of 10 and one camera request; how many of the flood started computing before the
    camera did (by the daemon's own queue times), and every request's (queue, compute) in ms."""
    with d.pipeline(timeout_s=30) as pipe:
        flood = [pipe.submit("slow", {"x": HEAVY}, key=flood_key) for _ in range(10)]
        camera = pipe.submit("slow", {"x": BIG[:1]}, key=camera_key)
        replies = {r.header["id"]: r for r in pipe.replies()}
    assert all(r.status == 200 for r in replies.values())
    timing = {i: r.header["timing_us"] for i, r in replies.items()}
    ahead = sum(timing[i]["queue"] < timing[camera]["queue"] for i in flood)
    shown = " ".join(f"{'camera ' if i == camera else ''}({t['queue'] // 1000}, {t['compute'] // 1000})"
                     for i, t in sorted(timing.items(), key=lambda it: it[1]["queue"]))
    return ahead, shown


def test_a_full_queue_makes_room_for_a_key_that_holds_less_of_it(make_daemon):
    d = make_daemon('[[models]]\nname = "slow"\nengine = "slower/1/model.onnx"\nmax_queue = 4\ntimeout_ms = 20000\n')
    # A compute that ends between the frontend reading the flood's last request and the camera's
    # frees a slot: the camera is then queued with nothing pushed out (stress round 17 on 98a52a9).
    # So the burst is sent again until the camera found the queue full, at most 3 times.
    for _ in range(3):
        with d.pipeline(timeout_s=30) as pipe:
            flood = [pipe.submit("slow", {"x": HEAVY}, key="flood") for _ in range(10)]
            camera = pipe.submit("slow", {"x": BIG[:1]}, key="camera")
            same_key = pipe.submit("slow", {"x": BIG[:1]}, key="flood")
            replies = {r.header["id"]: r for r in pipe.replies()}
        assert replies[camera].status == 200  # queued, or the flood's newest queued request made way for it
        pushed = [replies[i] for i in flood if "holds the most" in (replies[i].error or "")]
        assert len(pushed) <= 1
        if pushed:
            break
    assert len(pushed) == 1 and pushed[0].status == 429 and pushed[0].retry_after_ms >= 1
    assert replies[same_key].status == 429 and "holds the most" not in replies[same_key].error
    # The queue held 4 of the flood and gave one up; the executor may not have taken the first
    # from it before the others arrived (stress round 4 on 855db96), so at least 3 are served.
    assert sum(replies[i].status == 200 for i in flood) >= 3
