"""`infermux ctl cameras`'s text: a camera that gives no frame comes with the next step."""

from __future__ import annotations

from typing import Any

from infermux.cameras.table import NEXT_STEP, table


def entry(name: str, state: str, reason: str = "") -> dict[str, Any]:
    return {"camera": name, "state": state, "reason": reason, "fps_decoded": 15.0, "fps_served": 5.0,
            "capture_age_ms": {"p50": 20.0, "p95": 30.0, "p99": 40.0}, "reconnects": 0, "restarts": 0}


def test_a_lost_camera_gets_its_reason_and_what_to_do_next() -> None:
    text = table([entry("cam1", "streaming"),
                  entry("cam2", "lost", "cannot open rtsp://127.0.0.1:8554/cam2: Connection refused")]).splitlines()
    assert text[3] == "  cannot open rtsp://127.0.0.1:8554/cam2: Connection refused"
    assert text[-1] == NEXT_STEP and "infermux doctor" in NEXT_STEP


def test_a_refused_camera_gets_the_next_step_too() -> None:
    assert table([entry("big", "refused", "over this camera's max_pixels")]).splitlines()[-1] == NEXT_STEP


def test_cameras_that_stream_or_were_disabled_get_no_advice() -> None:
    text = table([entry("cam1", "streaming"), entry("cam2", "disabled"), entry("cam3", "ended")])
    assert NEXT_STEP not in text and text.splitlines()[-1].startswith("(rates per second")
