"""The feature matrix's camera row: a looping file camera whose pipeline's model step is hot or cold,
through a hot swap of that model, a reload that changes one camera, and drain (docs/matrix.md).

One daemon per placement (module-scoped, two cameras of one small clip); its cells run in order
on it and each leaves both cameras streaming. The shared `cell` fixture fails a cell whose daemon
logged a traceback or counted a 500 while it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from support.camera_files import camera, cameras, write_clip
from support.harness import Daemon, daemon_head, toml_lines
from support.matrix import WATCHING, Placement, placed_as, placement_daemon, publish_copy, versions
from support.pipelines import camera_pipeline
from support.polling import eventually

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[processors]'")

# Where the pipeline's model step runs: in the daemon, or in a worker process.
camera_placements = pytest.mark.parametrize("placed", ("hot", "cold"), indirect=True)
pytestmark = pytest.mark.timing  # frames against a watched directory's settle and a worker's start

CLASSIFIER = "classifier/1/model.onnx"


def config_text(placement: str, watched: Path, clip: Path, back_fps: int = 10) -> str:
    """Two cameras of `clip` into one camera pipeline on `classifier`, served from the watched directory."""
    models = '[[models]]\nname = "classifier"\n' + toml_lines({"engine": CLASSIFIER, **placed_as(placement)})
    cameras = camera("front", str(clip), fps=10) + camera("back", str(clip), fps=back_fps)
    return (daemon_head(watched, **WATCHING) + models + camera_pipeline("cams") + cameras).format()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_clip(tmp_path_factory.mktemp("matrix-clip") / "small.mp4", 64, 48, frames=30, fps=10)


@pytest.fixture(scope="module")
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, engines: Path,
           clip: Path) -> Iterator[Placement]:
    """A daemon whose cameras' model is placed as `request.param` says."""
    workdir = tmp_path_factory.mktemp(f"camera-matrix-{request.param}")
    watched = workdir / "engines"
    publish_copy(engines / CLASSIFIER, watched, "classifier", 1)
    d = placement_daemon(request.param, workdir, config_text(request.param, watched, clip))
    try:
        yield Placement(request.param, d, engines, watched)
    finally:
        assert d.stop() == 0, d.log()[-4000:]


def classifier_versions(d: Daemon) -> dict[str, dict[str, Any]]:
    return versions(d, "classifier")


def served_more(d: Daemon, name: str, than: int, what: str, timeout: float = 30) -> dict[str, Any]:
    """Camera `name` streaming with more than `than` frames served."""
    return eventually(lambda: (c := cameras(d).get(name)) and c["state"] == "streaming" and c["served"] > than
                      and c, what, timeout)


def assert_no_failed_frames(d: Daemon, before: dict[str, dict[str, Any]]) -> None:
    """No camera's frame got anything but a 200 since `before`, and their stream counts no failure."""
    now = cameras(d)
    for name, then in before.items():
        assert now[name]["failed"] == then["failed"], now[name]
    with d.admin() as admin:
        streams = admin.call("streams", model="cams")["streams"]
    assert all(s["failed"] == 0 for s in streams), streams


# -- the cells, in the order they run on each placement's daemon ------------------------------------


@camera_placements
def test_a_camera_is_served_by_its_pipeline_s_model_where_it_is_placed(cell: Placement) -> None:
    d = cell.daemon
    front = served_more(d, "front", 5, "front served")
    served_more(d, "back", 5, "back served")
    assert front["pipeline"] == "cams" and front["failed"] == 0
    where = classifier_versions(d)["1"]
    assert where["placement"] == cell.where, where
    assert_no_failed_frames(d, {})


@camera_placements
def test_a_camera_is_served_across_a_hot_swap_of_its_model(cell: Placement) -> None:
    d = cell.daemon
    before = cameras(d)
    publish_copy(cell.engines / CLASSIFIER, cell.watched, "classifier", 2)
    eventually(lambda: (v := classifier_versions(d).get("2")) and v["stats"]["by_status"].get("200", 0) > 0,
               "the camera's frames served by classifier version 2", 30)
    for name, then in before.items():
        now = served_more(d, name, then["served"] + 3, f"{name} served after the swap")
        assert now["pid"] == then["pid"], (then, now)  # a swap is the daemon's business, not the camera's
    assert_no_failed_frames(d, before)


@camera_placements
def test_a_reload_that_changes_one_camera_restarts_only_that_camera(cell: Placement, clip: Path) -> None:
    d = cell.daemon
    front, back = served_more(d, "front", 0, "front served"), served_more(d, "back", 0, "back served")
    d.config_path.write_text(config_text(cell.name, cell.watched, clip, back_fps=12))
    with d.admin() as admin:
        assert admin.call("reload")["changes"]["cameras_restarted"] == ["back"]
    again = eventually(lambda: (c := cameras(d)["back"])["pid"] not in (None, back["pid"]) and c,
                       "back restarted with its new fps", 30)
    served_more(d, "back", 0, "back served after its restart")
    served_more(d, "front", front["served"] + 3, "front served on after the reload")
    assert cameras(d)["front"]["pid"] == front["pid"] and again["fps"] == 12


@camera_placements
def test_drain_pauses_the_cameras_frames_without_restarting_them_and_resume_serves_them_again(
        cell: Placement) -> None:
    d = cell.daemon
    before = {name: served_more(d, name, 0, f"{name} served") for name in ("front", "back")}
    drained = d.ctl("drain")
    try:
        assert drained.returncode == 0, drained.stdout + drained.stderr
    finally:
        resumed = d.ctl("resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    for name, then in before.items():
        now = served_more(d, name, then["served"] + 3, f"{name} served after resume")
        assert now["pid"] == then["pid"] and now["restarts"] == then["restarts"], (then, now)
        if now["failed"] > then["failed"]:  # a frame sent while drained is refused, and only that way
            assert str(now["last_error"]).startswith("503"), now
