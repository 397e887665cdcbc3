"""docs/pipelines.md's "Four cameras" walk-through, run as written: its commands, in a folder laid
out as a fresh clone is, with the suite's own environment standing in for its first line (the install).

The OCR models come from rapidocr-onnxruntime's wheel (engines/fetch_ppocr.py), the daemon and the
bench are the commands the page gives, and the console is `infermux top` as that command builds it,
driven by Textual's pilot: tab 7 shows each camera's row."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from support import walkthrough
from support.harness import REPO
from support.tui_support import until
from support.walkthrough import argv, clone_of, wait_ready

pytest.importorskip("rapidocr_onnxruntime", reason="the OCR models come from rapidocr-onnxruntime")
pytest.importorskip("cv2", reason="the processors need OpenCV: pip install -e '.[processors]'")
pytestmark = pytest.mark.slow

BENCH_S = 12  # the page's --duration 60, shortened: long enough for the console to see every camera


async def test_four_cameras_run_as_the_page_says_and_the_console_shows_each(tmp_path: Path) -> None:
    clone = clone_of(tmp_path, ("engines/fetch_ppocr.py", "etc/infermux/examples/ocr.toml"))
    install, fetch, serve, bench, top = walkthrough.block(REPO / "docs/pipelines.md", "## Four cameras")
    assert install.startswith("python3 -m venv .venv") and "[onnx,tui,processors]" in install
    assert "--streams 4" in bench and top.split()[1] == "top"
    # Where this box's defaults would be /run and /var/lib: another daemon of the suite may hold those.
    env = {**os.environ, "RUNTIME_DIRECTORY": str(clone / "run"), "STATE_DIRECTORY": str(clone / "state")}
    fetched = subprocess.run(argv(fetch), cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert fetched.returncode == 0, fetched.stderr
    log = clone / "serve.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(argv(serve), cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(log, daemon)
        bench_argv = argv(bench)
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
    from infermux.tui.views.streams import StreamsTable

    app = walkthrough.console(top, clone, env)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.snapshots_seen > 0, what="a snapshot")
        await pilot.press("7")
        table = app.streams_view.query_one(StreamsTable)
        await until(pilot, lambda: len(table.keys()) == 4, what="four cameras on the Streams tab", timeout=60)
        return list(table.keys())
