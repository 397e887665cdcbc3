"""`infermux ctl cameras` as a table: one line per camera, then its last error on a line of its own.

Reasons and errors hold text from the camera and its stream (an RTSP server's words, a URL): they
are shown through format.printable, so no control character reaches the terminal.
"""

from __future__ import annotations

from typing import Any

from infermux import format as fmt

#: States in which a camera gives no frame for something outside the daemon (its url, the camera, the network).
DOWN = ("lost", "refused")
#: What to do then: the reason says what failed; doctor says what to check for the camera's kind of url.
NEXT_STEP = ("(a camera lost or refused: `infermux doctor` opens each camera once and says what to check; "
             "a lost one comes back by itself once it answers)")


def table(cameras: list[dict[str, Any]]) -> str:
    """The admin `cameras` reply's entries as text."""
    if not cameras:
        return "no cameras: the daemon's configuration has no [[cameras]] (docs/cameras.md)"
    lines = [f"{'CAMERA':<20} {'STATE':<10} {'DECODED':>7} {'GATED':>6} {'SENT':>6} {'SUPERS':>6} {'SERVED':>6} "
             f"{'DEC MS':>7} {'AGE P50':>8} {'AGE P95':>8} {'AGE P99':>8} {'RECONN':>6} {'RESTART':>7}"]
    for c in cameras:
        age = {q: fmt.us(v * 1000 if v is not None else None) for q, v in (c.get("capture_age_ms") or {}).items()}
        decode = "-" if c.get("decode_ms") is None else f"{c['decode_ms']:.1f}"
        lines.append(f"{fmt.printable(c.get('camera', '?'), 20):<20} {fmt.printable(c.get('state', '?'), 10):<10} "
                     f"{fmt.rate(c.get('fps_decoded')):>7} {fmt.rate(c.get('fps_gated')):>6} "
                     f"{fmt.rate(c.get('fps_sent')):>6} {fmt.rate(c.get('fps_superseded')):>6} "
                     f"{fmt.rate(c.get('fps_served')):>6} {decode:>7} {age.get('p50', '-'):>8} {age.get('p95', '-'):>8} "
                     f"{age.get('p99', '-'):>8} "
                     f"{c.get('reconnects', 0):>6} {c.get('restarts', 0):>7}")
        why = c.get("reason") or c.get("last_error")
        if why:
            lines.append(f"  {fmt.printable(why, 200)}")
        lines += [f"  {text}" for text in fmt.area_counts(c)]
    lines.append("(rates per second over the last 5 s; age: capture to result)")
    if any(c.get("state") in DOWN for c in cameras):
        lines.append(NEXT_STEP)
    return "\n".join(lines)

