"""The feature matrix's sink column: a tracked pipeline's streams whose detector (the model the `track`
step follows) is hot or cold, through a hot swap of that model, drain, and a reload that changes a sink
(docs/matrix.md).

One daemon per placement (module-scoped); its cells run in order on it. Its sinks: `jsonl` into the
test's folder (the reference: every event the daemon made) and a webhook to an HTTP server of the
test's. In every cell a stream's frames are answered 200, each object's `new` ... `end` reach the file,
and the webhook gets the same events in the same order (repeats only with their id). The shared `cell`
fixture fails a cell whose daemon logged a traceback or counted a 500 while it ran."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from support import models, tracking
from support.harness import Daemon, dealer
from support.matrix import WATCHING, Placement, placed_as, placement_daemon, publish_copy, versions
from support.polling import eventually
from support.sinks import Endpoint, events_daemon, first_of_each, jsonl, jsonl_events, sink_states, webhook
from support.tracking import detecting, replay

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

# Where the tracked pipeline's detector runs: in the daemon, or in a worker process.
sink_placements = pytest.mark.parametrize("placed", ("hot", "cold"), indirect=True)
pytestmark = pytest.mark.timing  # objects end after end_after_s; a watched directory's settle; a worker's start

DETECTOR = "det/1/model.onnx"
FRAMES = 16  # of the crossing: enough for its objects' new and updates


@dataclass
class SinkPlacement(Placement):
    """A placement's daemon, with its webhook's endpoint and the file its `jsonl` sink writes."""

    hook: Endpoint
    events: Path


def config_text(placement: str, watched: Path, events: Path, hook: str, hook_timeout_s: float = 5.0) -> str:
    """The tracked pipeline on `det` (served from the watched directory), a file sink and a webhook."""
    pipeline = detecting("tracked", min_frames=2, end_after_s=1.0, update_every_s=0.2)
    return events_daemon(watched, pipeline, jsonl(events), webhook("hook", hook, timeout_s=hook_timeout_s,
                                                                   max_retry_s=0.5), det=placed_as(placement),
                         **WATCHING)


@pytest.fixture(scope="module")
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           engines: Path) -> Iterator[SinkPlacement]:
    """A daemon whose tracked pipeline's detector is placed as `request.param` says."""
    workdir = tmp_path_factory.mktemp(f"sink-matrix-{request.param}")
    watched = workdir / "engines"
    models.brightness_map(watched / DETECTOR)
    hook = Endpoint([200])
    d = placement_daemon(request.param, workdir, config_text(request.param, watched, workdir / "events.jsonl",
                                                             hook.url))
    try:
        yield SinkPlacement(request.param, d, engines, watched, hook, workdir / "events.jsonl")
    finally:
        hook.close()
        assert d.stop() == 0, d.log()[-4000:]


def file_events(cell: SinkPlacement, key: str) -> list[dict[str, Any]]:
    return [e for e in jsonl_events(cell.events) if e["key"] == key]


def ended(cell: SinkPlacement, key: str) -> list[dict[str, Any]] | None:
    """Stream `key`'s events in the file once each object it made has ended (None until then)."""
    events = file_events(cell, key)
    news = sum(e["type"] == "new" for e in events)
    return events if news and news == sum(e["type"] == "end" for e in events) else None


def arrive(cell: SinkPlacement, key: str, before: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Stream `key`'s frames answered 200; every object's events, `new` to `end`, in the file and, in the
    same order, at the webhook. Returns them."""
    with dealer(cell.daemon.endpoint) as sock:
        sent = replay(sock, "tracked", tracking.crossing(), key, before=before, frames=FRAMES)
    assert set(sent.statuses) == {200}, sent.statuses
    return delivered(cell, key)


def delivered(cell: SinkPlacement, key: str) -> list[dict[str, Any]]:
    made = eventually(lambda: ended(cell, key), f"{key}'s objects ended in the file", 30)
    ids = [e["id"] for e in made]
    eventually(lambda: [e["id"] for e in first_of_each(list(cell.hook.bodies)) if e["key"] == key] == ids,
               f"{key}'s events at the webhook, in order", 30)
    return made


def det_versions(d: Daemon) -> dict[str, dict[str, Any]]:
    return versions(d, "det")


# -- the cells, in the order they run on each placement's daemon ------------------------------------


@sink_placements
def test_a_streams_object_events_reach_the_sinks_where_the_tracker_s_model_is_placed(cell: SinkPlacement) -> None:
    made = arrive(cell, f"served-{cell.name}")
    assert [e["type"] for e in made][0] == "new" and made[-1]["type"] == "end"
    assert det_versions(cell.daemon)["1"]["placement"] == cell.where
    assert all(s["state"] == "up" and s["backlog"] == 0 for s in sink_states(cell.daemon).values())


@sink_placements
def test_events_reach_the_sinks_across_a_hot_swap_of_the_tracker_s_model(cell: SinkPlacement) -> None:
    def publish(i: int) -> None:
        if i == FRAMES // 3:  # mid-stream, as the documented way: a folder renamed into place
            publish_copy(cell.watched / DETECTOR, cell.watched, "det", 2)

    arrive(cell, f"swapped-{cell.name}", before=publish)
    eventually(lambda: (v := det_versions(cell.daemon).get("2")) and v["state"] == "ready", "det v2 ready", 30)
    arrive(cell, f"after-swap-{cell.name}")  # the frames now on v2: its objects' events reach both sinks
    assert det_versions(cell.daemon)["2"]["stats"]["by_status"].get("200", 0) > 0


@sink_placements
def test_events_made_while_drained_reach_the_sinks_and_resume_makes_more(cell: SinkPlacement) -> None:
    d, key = cell.daemon, f"drained-{cell.name}"
    with dealer(d.endpoint) as sock:
        assert set(replay(sock, "tracked", tracking.crossing(), key, frames=FRAMES).statuses) == {200}
    drained = d.ctl("drain")
    try:
        assert drained.returncode == 0, drained.stdout + drained.stderr
        delivered(cell, key)  # the objects end while drained, and their events leave the box
    finally:
        resumed = d.ctl("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    arrive(cell, f"resumed-{cell.name}")


@sink_placements
def test_a_reload_that_changes_a_sink_keeps_every_event_of_a_stream_going_through_it(cell: SinkPlacement) -> None:
    d, key = cell.daemon, f"reloaded-{cell.name}"
    changed = config_text(cell.name, cell.watched, cell.events, cell.hook.url, hook_timeout_s=6)
    with dealer(d.endpoint) as sock:
        def reload(i: int) -> None:
            if i == FRAMES // 2:  # mid-stream: objects alive, events spooled for the changed sink
                d.config_path.write_text(changed)
                with d.admin() as admin:
                    admin.call("reload", check=True)
        assert set(replay(sock, "tracked", tracking.crossing(), key, before=reload, frames=FRAMES).statuses) == {200}
    delivered(cell, key)
    with d.admin() as admin:
        kinds = [(e["kind"], e["sink"]) for e in admin.call("events", limit=1000)["events"]
                 if e["kind"] in ("sink_added", "sink_removed", "sink_changed")]
    assert kinds[-1:] == [("sink_changed", "hook")], kinds
    assert all(s["state"] == "up" for s in sink_states(d).values())
    arrive(cell, f"after-reload-{cell.name}")
