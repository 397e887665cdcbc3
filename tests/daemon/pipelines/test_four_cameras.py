"""docs/pipelines.md's "Four cameras" walk-through, run as written: its commands, in a folder laid
out as a fresh clone is, with the suite's own environment standing in for its first line (the install).

The OCR models come from rapidocr-onnxruntime's wheel (engines/fetch_ppocr.py), the daemon and the
bench are the commands the page gives, and the console is `infermux top` as that command builds it,
driven by Textual's pilot: tab 7 shows each camera's row."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from support.tui_support import until
from support.walkthrough import clone_of, commands, local

pytest.importorskip("rapidocr_onnxruntime", reason="the OCR models come from rapidocr-onnxruntime")
pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytestmark = pytest.mark.slow

BENCH_S = 12  # the page's --duration 60, shortened: long enough for the console to see every camera


def wait_ready(log: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while " ready " not in log.read_text():
        assert proc.poll() is None, f"the daemon exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the daemon was not ready in {timeout_s} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


async def test_four_cameras_run_as_the_page_says_and_the_console_shows_each(tmp_path: Path) -> None:
    install, fetch, serve, bench, top = commands("pipelines.md", "## Four cameras")
    clone = clone_of(tmp_path, ("engines/fetch_ppocr.py", "etc/infermux/examples/ocr.toml"))
    assert install.startswith("python3 -m venv .venv") and "[onnx,tui,processors]" in install
    assert "--streams 4" in bench and top.split()[1] == "top"
    # Where this box's defaults would be /run and /var/lib: another daemon of the suite may hold those.
    env = {**os.environ, "RUNTIME_DIRECTORY": str(clone / "run"), "STATE_DIRECTORY": str(clone / "state")}
    fetched = subprocess.run(local(fetch), cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert fetched.returncode == 0, fetched.stderr
    log = clone / "serve.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(local(serve), cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(log, daemon)
        bench_argv = local(bench)
        bench_argv[bench_argv.index("--duration") + 1] = str(BENCH_S)
        cameras = subprocess.Popen(bench_argv, cwd=clone, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        keys = await asyncio.wait_for(console_rows(top, clone, env), timeout=90)
        output, errors = await asyncio.to_thread(cameras.communicate, timeout=120)
    finally:
        daemon.terminate()
        daemon.wait(30)
    assert cameras.returncode == 0, errors
    assert len(keys) == 4 and all(k.startswith("ocr/") for k in keys), keys
    rows = {line.split()[0]: line.split() for line in output.splitlines()[2:]}
    streams = sorted(k for k in rows if k != "all")
    assert len(streams) == 4 and [f"ocr/{s}" for s in streams] == sorted(keys), (output, keys)
    for stream in streams:
        assert int(rows[stream][4]) > 0, output  # every camera was served
    assert "Traceback" not in log.read_text()


async def console_rows(top: str, clone: Path, env: dict[str, str]) -> list[str]:
    """Tab 7 of `infermux top` (built as the command builds it) once it has four cameras."""
    import argparse

    from infermux.cli import top as top_command
    from infermux.tui.app import TopApp
    from infermux.tui.feed import Endpoints, LiveFeed
    from infermux.tui.views.streams import StreamsTable

    parser = argparse.ArgumentParser()
    top_command.add_arguments(parser)
    args = parser.parse_args(local(top)[2:])
    args.config = str(clone / args.config)
    saved = os.environ.get("RUNTIME_DIRECTORY")
    os.environ["RUNTIME_DIRECTORY"] = env["RUNTIME_DIRECTORY"]  # the console finds the sockets as the page's would
    try:
        admin, stats, config = top_command.endpoints(args)
    finally:
        if saved is None:
            del os.environ["RUNTIME_DIRECTORY"]
        else:
            os.environ["RUNTIME_DIRECTORY"] = saved
    app = TopApp(LiveFeed(Endpoints(admin, stats)), config_path=config)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("7")
        table = app.streams_view.query_one(StreamsTable)
        await until(pilot, lambda: len(table.keys()) == 4, what="four cameras on the Streams tab", timeout=60)
        return list(table.keys())
