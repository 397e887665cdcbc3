"""docs/cameras.md's "Try it: four cameras", run as written: its commands, in a folder laid out as a
fresh clone is, with the suite's own environment standing in for the install line and
support.system_packages for the `sudo apt install` line (the packages it names are what the test
requires).

The four cameras are the page's `examples/rtsp_cameras.py` (GStreamer's RTSP server, by the system's
python3), on a free port instead of 8554 (another test's server may hold it), the copied configuration
pointing at that port; the daemon and `ctl cameras` are the page's commands, and the console is
`infermux top` as that command builds it, driven by Textual's pilot: tab 8 shows each camera served."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from support import system_packages, walkthrough
from support.harness import REPO
from support.polling import eventually
from support.tui_support import until
from support.walkthrough import argv, clone_of, wait_ready

pytest.importorskip("av", reason="cameras decode with PyAV: pip install -e '.[cameras]'")
pytest.importorskip("cv2", reason="the pipeline's processors need OpenCV: pip install -e '.[cameras]'")
pytest.importorskip("textual", reason="the console needs Textual: pip install -e '.[tui]'")
pytestmark = pytest.mark.slow

PAGE = REPO / "docs/cameras.md"
CONFIG = "etc/infermux/examples/cameras.toml"
CAMERAS = ["cam1", "cam2", "cam3", "cam4"]
_LIB = f"/usr/lib/{platform.machine()}-linux-gnu"
# What proves each package the page's apt line names is here (a file -> its Debian package).
PROBES = {
    "/usr/lib/python3/dist-packages/gi/__init__.py": "python3-gi",
    f"{_LIB}/girepository-1.0/GstRtspServer-1.0.typelib": "gir1.2-gst-rtsp-server-1.0",
    f"{_LIB}/gstreamer-1.0/libgstvideotestsrc.so": "gstreamer1.0-plugins-base",
    f"{_LIB}/gstreamer-1.0/libgstrtp.so": "gstreamer1.0-plugins-good",
    f"{_LIB}/gstreamer-1.0/libgstx264.so": "gstreamer1.0-plugins-ugly",
}


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The files the page's commands name, at their paths in a clone (the sample engine included)."""
    return clone_of(tmp_path, ("examples/rtsp_cameras.py", CONFIG, "engines/classifier/1/model.onnx"))


@pytest.fixture
def commands() -> list[str]:
    """The page's block (and its install line), checked for what they must hold: the extras and the system
packages the rest needs, the page's configuration."""
    (install,) = walkthrough.block(PAGE, "## Install")
    apt, cameras, serve, ctl, top = walkthrough.block(PAGE, "## Try it: four cameras")
    assert install.startswith("python3 -m venv .venv") and "[onnx,cameras,tui]" in install, install
    assert apt.startswith("sudo apt install ") and set(apt.split()[3:]) == set(PROBES.values()), apt
    assert cameras.startswith("/usr/bin/python3 examples/rtsp_cameras.py"), cameras
    assert serve.endswith(f"serve --config {CONFIG}") and top.endswith(f"top --config {CONFIG}"), (serve, top)
    assert "ctl cameras" in ctl, ctl
    system_packages.require(PROBES)
    return [cameras, serve, ctl, top]


@pytest.fixture
def served_cameras(clone: Path, commands: list[str]) -> Iterator[int]:
    """The page's cameras, on a free port: the configuration's copy points at it."""
    log = clone / "cameras.log"
    with open(log, "w") as out:
        server = subprocess.Popen([*argv(commands[0]), "--port", "0"], cwd=clone, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        def listening() -> list[str]:
            assert server.poll() is None, f"examples/rtsp_cameras.py exited:\n{log.read_text()}"
            urls = [line for line in log.read_text().splitlines() if line.startswith("rtsp://")]
            return urls if len(urls) == len(CAMERAS) else []

        urls = eventually(listening, what="the cameras' URLs", timeout_s=30)
        port = int(urls[0].split(":")[2].split("/")[0])
        assert urls == [f"rtsp://127.0.0.1:{port}/{name}" for name in CAMERAS], urls
        config = clone / CONFIG
        assert config.read_text().count('url = "rtsp://127.0.0.1:8554/') == len(CAMERAS)
        config.write_text(config.read_text().replace('url = "rtsp://127.0.0.1:8554/', f'url = "rtsp://127.0.0.1:{port}/'))
        yield port
    finally:
        server.terminate()
        server.wait(10)


async def test_four_cameras_run_as_the_page_says_and_the_console_shows_each_served(
        clone: Path, commands: list[str], served_cameras: int) -> None:
    _, serve, ctl, top = commands
    # Where this box's defaults would be /run and /var/lib: another daemon of the suite may hold those.
    env = {**os.environ, "RUNTIME_DIRECTORY": str(clone / "run"), "STATE_DIRECTORY": str(clone / "state")}
    log = clone / "serve.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(argv(serve), cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(log, daemon)
        rows = await asyncio.wait_for(console_rows(top, clone, env), timeout=90)
        listed = eventually(lambda: ctl_rows(ctl, clone, env), timeout_s=30,
                            what="ctl cameras listing four cameras streaming and served")
    finally:
        daemon.terminate()
        daemon.wait(30)
    assert sorted(rows) == CAMERAS and all(state == "streaming" for state, _ in rows.values()), rows
    assert sorted(listed) == CAMERAS, listed
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert all(f"camera_streaming camera={name}" in text for name in CAMERAS), text[-3000:]


def ctl_rows(ctl: str, clone: Path, env: dict[str, str]) -> dict[str, list[str]] | None:
    """The page's `ctl cameras`, once it exits 0 with a row per camera streaming and served (else None)."""
    done = subprocess.run(argv(ctl), cwd=clone, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = lines[0].split()
    assert head[:2] == ["CAMERA", "STATE"] and "SERVED" in head, done.stdout
    rows = {words[0]: words for words in (line.split() for line in lines[1:]) if words and words[0] in CAMERAS}
    ok = len(rows) == len(CAMERAS) and all(
        r[1] == "streaming" and float(r[head.index("SERVED")]) > 0 for r in rows.values())
    return rows if ok else None


async def console_rows(top: str, clone: Path, env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Tab 8 of `infermux top` (built as the command builds it) once it shows four cameras served:
    per camera its STATE and SERVED cells."""
    from infermux.tui.views.cameras import CamerasTable

    app = walkthrough.console(top, clone, env)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("8")
        table = app.cameras_view.query_one(CamerasTable)

        def served() -> bool:
            cells = [(table.cell_text(k, "state").strip(), table.cell_text(k, "served").strip()) for k in table.keys()]
            return len(cells) == len(CAMERAS) and all(s == "streaming" and float(n) > 0 for s, n in cells)

        await until(pilot, served, what="four cameras served on the Cameras tab", timeout=60)
        return {k: (table.cell_text(k, "state").strip(), table.cell_text(k, "served").strip()) for k in table.keys()}
