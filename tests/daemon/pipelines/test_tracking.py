"""Tracking and per-track secondary inference on a real daemon: frames in, track ids and reused answers out.

One daemon serves a "detector" (tests/support/models.py's brightness map,
read by `dbnet`) in a watched engine directory, and copies of the test
classifier, behind pipelines that differ in their `track` and re-inference
settings. The frames are the shipped generated sequences
(tests/support/tracking.py), drawn and sent as PNG with their stream's key.
The detector sees each object's visible part, so identities are scored
against the visible boxes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import zmq

pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")

from support import models, tracking  # noqa: E402
from support.harness import REPO, Daemon, dealer, free_port  # noqa: E402
from support.metrics import scrape  # noqa: E402
from support.tracking import (Replay, classifying, detecting, every_nth, id_switches, idf1, png, replay,  # noqa: E402
                              rows_computed)

from infermux.config import ConfigError, parse  # noqa: E402
from infermux.pipelines.wire import send_frame  # noqa: E402

CLASSIFIER = REPO / "engines/classifier/1/model.onnx"


def config_text(watched: Path, metrics_port: int) -> str:
    text = f"""
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{watched}"
metrics_port = {metrics_port}
watch_settle_s = 0.4
watch_debounce_s = 0.02
watch_rescan_s = 1.0

[[models]]
name = "det"
engine = "det/1/model.onnx"
"""
    for model in ("cls_all", "cls_every", "cls_grow", "cls_budget"):
        text += f'[[models]]\nname = "{model}"\nengine = "{CLASSIFIER}"\nmax_batch = 32\n'
    text += detecting("tracks")
    text += classifying("every_frame", "cls_all")
    text += classifying("every_5", "cls_every", "reinfer_every = 5")
    text += classifying("on_growth", "cls_grow", "reinfer_every = 1000\nreinfer_growth = 0.2")
    text += classifying("budget", "cls_budget", "max_calls_per_s = 40")
    return text


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("tracking")
    watched = workdir / "engines"
    models.brightness_map(watched / "det" / "1" / "model.onnx")
    port = free_port()
    d = Daemon(workdir, config_text(watched, port)).start()
    d.watched, d.metrics_port = watched, port  # type: ignore[attr-defined]
    yield d
    assert d.stop() == 0, d.log()[-4000:]
    assert "Traceback" not in d.log(), d.log()[-6000:]


@pytest.fixture
def sock(daemon: Daemon) -> Iterator[zmq.Socket]:
    with dealer(daemon.endpoint) as s:
        yield s


def streams(daemon: Daemon, pipeline: str, seqs: list[tracking.Sequence], key: str) -> dict[str, Replay]:
    """Each sequence sent by a camera of its own (a socket, a thread, key `key`/name) at once."""
    out: dict[str, Replay] = {}

    def camera(seq: tracking.Sequence) -> None:
        with dealer(daemon.endpoint) as s:
            out[seq.name] = replay(s, pipeline, seq, f"{key}/{seq.name}")
    threads = [threading.Thread(target=camera, args=(seq,)) for seq in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(out) == {s.name for s in seqs}, "a camera thread failed"
    return out


# -- tracking ---------------------------------------------------------------------------------------


def test_four_cameras_keep_their_objects_identities_through_a_detector_pipeline(daemon: Daemon) -> None:
    seqs = tracking.sequences()
    replies = streams(daemon, "tracks", seqs, "ids")
    failures = {}
    for seq in seqs:
        got = replies[seq.name]
        assert set(got.statuses) == {200}, got.statuses
        truth, predicted = seq.ground_truth(visible_boxes=True), got.predicted()
        scores, switches = idf1(truth, predicted), id_switches(truth, predicted)
        print(f"{seq.name}: IDF1 {scores.idf1:.3f}, {switches} identity switches")
        if scores.idf1 < 0.9:
            failures[seq.name] = scores
    assert not failures, failures
    ids = [{t for frame in replies[s.name].predicted() for t in frame} for s in seqs]
    assert sum(map(len, ids)) == len(set().union(*ids)), "two cameras share a track id"
    with daemon.admin() as admin:
        view = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "tracks")
    assert view["steps"]["track"]["tracking"]["streams"] >= 4


def test_a_frame_without_a_key_is_a_400_naming_the_key(sock: zmq.Socket) -> None:
    reply = send_frame(sock, "tracks", png(tracking.crossing().frame(0)), "png")
    assert reply.status == 400, reply.header
    assert "step 'track'" in reply.header["error"] and "\"key\"" in reply.header["error"], reply.header


def test_infer_sends_a_frame_with_its_streams_key_and_prints_the_track_ids(daemon: Daemon, tmp_path: Path) -> None:
    image = tmp_path / "frame.png"
    image.write_bytes(png(tracking.crowd().frame(0)))
    command = [sys.executable, "-m", "infermux", "infer", "tracks", "--image", str(image), "--endpoint", daemon.endpoint]
    out = subprocess.run([*command, "--key", "cli"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("  track ") == len(tracking.crowd().truth[0]), out.stdout
    keyless = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert keyless.returncode == 1 and "400" in keyless.stderr and '"key"' in keyless.stderr, keyless.stderr


def test_identities_survive_a_hot_swap_of_the_detector(daemon: Daemon, sock: zmq.Socket) -> None:
    watched: Path = daemon.watched  # type: ignore[attr-defined]
    version = 1 + max(int(p.name) for p in (watched / "det").iterdir() if p.name.isdigit())

    def swap_midway(i: int) -> None:
        if i == 30:
            staged = watched / "det" / f".{version}.tmp"
            staged.mkdir()
            shutil.copyfile(watched / "det" / "1" / "model.onnx", staged / "model.onnx")
            os.rename(staged, watched / "det" / str(version))
        if i == 60:  # the rest of the sequence goes to the new version (the tracks wait: they live 10 s)
            daemon.wait_for(f"swapped model=det version={version}", 60)
    seq = tracking.crossing()
    got = replay(sock, "tracks", seq, "swap", before=swap_midway)
    assert set(got.statuses) == {200}, got.statuses
    assert served_by(daemon, "det", str(version)) >= seq.length - 60
    truth, predicted = seq.ground_truth(visible_boxes=True), got.predicted()
    # Tracks kept by the version that served would restart at the swap: every object a new id.
    assert idf1(truth, predicted).idf1 >= 0.9 and id_switches(truth, predicted) <= 1


def served_by(d: Daemon, model: str, version: str) -> int:
    with d.admin() as admin:
        rows = admin.call("models")["models"]
    return sum(m["stats"]["by_status"].get("200", 0) for m in rows if (m["name"], m["version"]) == (model, version))


# -- secondary inference per track ----------------------------------------------------------------


def test_a_tracks_secondary_answer_is_computed_every_n_frames_and_reused_between(daemon: Daemon,
                                                                                   sock: zmq.Socket) -> None:
    seq = tracking.crowd()
    before_all, before_every = rows_computed(daemon, "cls_all"), rows_computed(daemon, "cls_every")
    every = replay(sock, "every_5", seq, "every")
    reference = replay(sock, "every_frame", seq, "reference")
    assert set(every.statuses) == set(reference.statuses) == {200}
    assert not every_nth(every, 5), every_nth(every, 5)
    # The model computed exactly the regions the replies say were computed: one row each.
    calls = rows_computed(daemon, "cls_every") - before_every
    assert calls == every.computed()
    everything = rows_computed(daemon, "cls_all") - before_all
    assert everything == sum(len(h["regions"]) for h in reference.headers)
    print(f"secondary calls: {calls} with reinfer_every = 5, {everything} without")
    assert calls <= everything / 5 + len(every.by_track())
    # A reused answer is the one computed last for its track.
    for regions in every.by_track().values():
        last = None
        for region in regions:
            if region["cached"]:
                assert region["label"] == last, regions
            last = region["label"]


def test_the_views_count_tracks_and_reused_answers(daemon: Daemon, sock: zmq.Socket) -> None:
    got = replay(sock, "every_5", tracking.stop_and_go(), "views", frames=20)
    reused = sum(1 for regions in got.by_track().values() for r in regions if r["cached"])
    assert reused > 0
    with daemon.admin() as admin:
        view = next(p for p in admin.call("pipelines")["pipelines"] if p["name"] == "every_5")
    assert view["steps"]["track"]["tracking"]["streams"] >= 1 and view["steps"]["track"]["tracking"]["tracks"] >= 3
    assert view["steps"]["cls_every"]["reinfer"]["reused"] >= reused and view["steps"]["cls_every"]["reinfer"]["computed"] > 0
    metrics = scrape(daemon.metrics_port)  # type: ignore[attr-defined]
    labels = 'pipeline="every_5",step="cls_every"'
    assert metrics[f'infermux_pipeline_reinfer_regions_total{{{labels},outcome="reused"}}'] >= reused
    assert metrics['infermux_pipeline_tracks{pipeline="every_5",step="track"}'] >= 3


def grown(size: int) -> np.ndarray:
    """One square of side `size`, centred in the frame."""
    image = np.zeros((tracking.H, tracking.W, 3), np.uint8)
    x0, y0 = (tracking.W - size) // 2, (tracking.H - size) // 2
    image[y0:y0 + size, x0:x0 + size] = (255, 200, 40)
    return image


def test_a_box_that_grows_by_reinfer_growth_is_computed_again(daemon: Daemon, sock: zmq.Socket) -> None:
    sides = [40] * 8 + [50] * 8 + [52] * 8 + [40] * 8  # area +56 %, then +8 % and -36 % from the 50
    replies = [send_frame(sock, "on_growth", png(grown(side)), "png", key="grow") for side in sides]
    assert {r.status for r in replies} == {200}
    regions = [r.header["regions"] for r in replies]
    assert all(len(found) == 1 for found in regions) and len({f[0]["track_id"] for f in regions}) == 1
    assert [k for k, found in enumerate(regions) if found[0]["cached"] is False] == [0, 8, 24]


def test_max_calls_per_s_bounds_the_steps_calls_over_every_stream(daemon: Daemon) -> None:
    seqs = [tracking.crossing(), tracking.crowd(), tracking.stop_and_go()]
    before = rows_computed(daemon, "cls_budget")
    start = time.monotonic()
    replies = streams(daemon, "budget", seqs, "budget")
    elapsed = time.monotonic() - start
    computed = sum(r.computed() for r in replies.values())
    regions = [region for r in replies.values() for h in r.headers for region in h["regions"]]
    reused = sum(1 for region in regions if region["cached"])
    skipped = [region for region in regions if region.get("skipped")]
    print(f"{computed} regions computed in {elapsed:.2f} s at 40 a second, {reused} reused, {len(skipped)} skipped, "
          f"of {len(regions)}")
    assert computed == rows_computed(daemon, "cls_budget") - before
    assert computed <= 40 * elapsed + 40  # a second's worth of burst, then 40 a second
    # And the budget is used, not starved (loosely: a box that stalls for seconds lets tokens go unused).
    assert computed >= min(len(regions), 40 + 40 * elapsed) / 4
    assert reused and skipped  # over the budget: the last answer where a track has one, else skipped
    assert all(region["cached"] is False and "label" not in region for region in skipped)


@pytest.mark.parametrize("steps, words", [
    ('[[pipelines.steps]]\nmodel = "m"\nfor_each = "regions"\nreinfer_every = 5',
     ["steps[0].reinfer_every", "needs a 'track' step before it"]),
    ('[[pipelines.steps]]\nmodel = "m"\nreinfer_every = 5', ["steps[0].reinfer_every", "for_each = \"regions\""]),
    ('[[pipelines.steps]]\nprocessor = "decode"\nmax_calls_per_s = 5', ["steps[0].max_calls_per_s", "model steps"]),
    ('[[pipelines.steps]]\nprocessor = "track"\n[[pipelines.steps]]\nmodel = "m"\nfor_each = "regions"\n'
     'reinfer_every = 0', ["steps[1].reinfer_every", ">= 1"]),
    ('[[pipelines.steps]]\nprocessor = "track"\n[[pipelines.steps]]\nmodel = "m"\nfor_each = "regions"\n'
     'reinfer_growth = -0.5', ["steps[1].reinfer_growth", "positive"]),
    ('[[pipelines.steps]]\nprocessor = "track"\nfor_each = "regions"', ["steps[0].for_each", "track step"]),
    ('[[pipelines.steps]]\nprocessor = "track"\noptions = { max_lost = -1 }', ["steps[0].options", "max_lost"]),
])
def test_bad_tracking_configs_name_the_step_and_option(steps: str, words: list[str]) -> None:
    text = f'[[models]]\nname = "m"\nengine = "m.onnx"\n[[pipelines]]\nname = "p"\n{steps}\n'
    with pytest.raises(ConfigError) as error:
        parse(text, Path("/etc/infermux/x.toml"))
    assert all(w in str(error.value) for w in ["pipelines[0]", *words]), str(error.value)
