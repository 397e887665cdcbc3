"""The cameras' Prometheus series (docs/cameras.md#metrics): one set per configured camera, labelled
`camera`, from what `ctl cameras` shows. admin/metrics.py writes them as it writes its own families."""

from __future__ import annotations

from typing import Any

from infermux.cameras.supervisor import COUNTERS

STATES = ("starting", "streaming", "lost", "refused", "restarting", "ended", "disabled", "stopped")

Family = tuple[str, str, str, list[tuple[dict[str, Any], float]]]  # name, type, help, samples


def families(cameras: list[dict[str, Any]]) -> list[Family]:
    """Each family's name, type, help and samples for the cameras' entries (`Cameras.view()`)."""
    def each(value: Any) -> list[tuple[dict[str, Any], float]]:
        return [({"camera": c["camera"]}, float(value(c))) for c in cameras]

    ages = [({"camera": c["camera"], "quantile": q}, c["capture_age_ms"][key] / 1e3)
            for c in cameras for q, key in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
            if c["capture_age_ms"].get(key) is not None]
    return [
        ("infermux_camera_up", "gauge", "1 while the camera's frames flow (state streaming), else 0.",
         each(lambda c: c["state"] == "streaming")),
        ("infermux_camera_state", "gauge", "1 for the state each camera is in.",
         [({"camera": c["camera"], "state": c["state"]}, 1.0) for c in cameras if c["state"] in STATES]),
        ("infermux_camera_fps", "gauge", "The rate a camera's frames are taken at: its fps setting (the alert "
         "InfermuxCameraBelowFps compares the frames taken with it).", each(lambda c: c["fps"])),
        ("infermux_camera_frames_total", "counter", "A camera's frames: decoded, taken at its fps, gated out (no "
         "motion), sent, superseded (replaced by a newer one before they were sent), served (200), refused (429 "
         "or 503: the daemon draining, busy or loading the model), failed (any other status).",
         [({"camera": c["camera"], "what": what}, float(c[what])) for c in cameras for what in COUNTERS]),
        ("infermux_camera_decode_seconds_total", "counter", "CPU time spent decoding a camera's frames.",
         each(lambda c: c["decode_seconds_total"])),
        ("infermux_camera_reconnects_total", "counter", "Times a camera's stream was lost and opened again.",
         each(lambda c: c["reconnects"])),
        ("infermux_camera_restarts_total", "counter", "Times a camera's process ended (a crash, a hang) and was "
         "started again.", each(lambda c: c["restarts"])),
        ("infermux_camera_capture_age_seconds", "gauge", "Capture-to-result age of a camera's last served frames.",
         ages),
        ("infermux_zone_objects", "gauge", "Tracked objects in a camera's zone now, per label (events.md).",
         [({"camera": c["camera"], "zone": zone, "label": label}, float(n)) for c in cameras
          for zone, labels in c.get("zones", {}).items() for label, n in labels.items()]),
        ("infermux_line_crossings_total", "counter", "Tracked objects that crossed a camera's line, per direction "
         "(in, out) and label (events.md).",
         [({"camera": c["camera"], "line": line, "direction": d, "label": label}, float(n)) for c in cameras
          for line, ways in c.get("lines", {}).items() for d, labels in ways.items() for label, n in labels.items()]),
    ]
