"""The cameras view: per camera of the daemon's `[[cameras]]`, its state and where its frames go.

It reads the snapshot's `cameras` (cameras/supervisor.py, the same entries admin `cameras`,
`infermux ctl cameras` and the `infermux_camera_*` series show): the camera's state, coloured
(red: lost or refused, yellow: starting or restarting, dim: ended, disabled or stopped), frames per
second decoded, gated out by the motion gate, sent, served, the mean decode time, the
capture-to-result age at p95 and p99, and reconnects; wider terminals add its p50, frames superseded,
restarts and the last error. The lines under the table give the selected camera's reason or last
error in full (the table cuts it), and its zones' and lines' counts per label. `S` asks the daemon
for a snapshot of the selected camera (admin `snapshot`, as `infermux ctl snapshot`: its newest
frame with its boxes drawn, saved as a JPEG) and the line below them says the file it wrote, or
why it could not.

Names, reasons and errors hold text from the configuration and the camera (an RTSP server's words):
cells are plain text (never markup) passed through format.printable, and the lines around the
table escape what they show.
"""

from __future__ import annotations

from typing import Any, Iterator

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static

from infermux import format as fmt
from infermux.cameras.table import DOWN, NEXT_STEP
from infermux.tui.views.table import Cell, Col, KeyedTable
from infermux.tui.markup import escape

EMPTY = ("no cameras: the daemon's configuration has no [[cameras]]\n"
         "[dim]docs/cameras.md: a camera is a name, a url and the pipeline its frames go to[/]")
HEAD = ("{n} · rates per second over the last 5 s\n"
        "[dim]GATED: left out by the motion gate · AGE: capture to result[/]")

#: A state's style; a state not listed is shown plain.
STATE_STYLES = {"streaming": "green", "starting": "yellow", "restarting": "yellow", "lost": "bold red",
                "refused": "bold red", "ended": "dim", "disabled": "dim", "stopped": "dim"}
#: States the line above the table counts as down.
TROUBLE = ("lost", "refused", "restarting")


def why(camera: dict[str, Any]) -> str:
    """What went wrong last on a camera: its state's reason, else its last error ("" when neither)."""
    return str(camera.get("reason") or camera.get("last_error") or "")


def _ms(value: Any) -> str:
    return "-" if value is None else fmt.us(float(value) * 1000)


class CamerasTable(KeyedTable):
    """A row per camera, keyed by its name: state, frames per second decoded, gated out, sent and
    served, decode ms, capture-to-result age p95 and p99, reconnects; wider terminals add the age's p50,
    frames superseded, restarts and the last error."""

    COLUMNS = (
        Col("camera", "CAMERA", 12), Col("state", "STATE", 11), Col("decoded", "DEC/S", 6, True),
        Col("gated", "GATED", 6, True), Col("sent", "SENT", 6, True), Col("served", "SERVED", 7, True),
        Col("decode_ms", "DEC MS", 7, True), Col("p50", "AGE P50", 8, True, optional=True),
        Col("p95", "AGE P95", 8, True), Col("p99", "AGE P99", 8, True),
        Col("reconnects", "RECONN", 7, True), Col("superseded", "SUPERS", 7, True, optional=True),
        Col("restarts", "RESTART", 8, True, optional=True), Col("error", "  LAST ERROR", 40, optional=True),
    )

    class Moved(Message):
        """The cursor moved to another camera: the line under the table follows it at once."""

    def update_from(self, snapshot: dict[str, Any]) -> None:
        self.sync(self.row_cells(list(snapshot.get("cameras") or [])))

    def _move(self, row: int) -> None:
        super()._move(row)
        self.post_message(self.Moved())

    def action_select(self) -> None:
        """Enter does nothing here: the detail screen is a model version's, and a camera is not one."""

    @staticmethod
    def row_cells(cameras: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Cell]]]:
        for c in cameras:
            state = str(c.get("state") or "?")
            style = STATE_STYLES.get(state, "")
            red = style if style == "bold red" else ""
            age = c.get("capture_age_ms") or {}
            decode = c.get("decode_ms")
            yield str(c.get("camera")), {
                "camera": (fmt.printable(c.get("camera", "?")), red or "bold"),
                "state": (fmt.printable(state), style),
                "decoded": (fmt.rate(c.get("fps_decoded")), red),
                "gated": (fmt.rate(c.get("fps_gated")), red or "dim"),
                "sent": (fmt.rate(c.get("fps_sent")), red),
                "served": (fmt.rate(c.get("fps_served")), red),
                "decode_ms": ("-" if decode is None else f"{float(decode):.1f}", red),
                "p50": (_ms(age.get("p50")), red),
                "p95": (_ms(age.get("p95")), red),
                "p99": (_ms(age.get("p99")), red),
                **_troubles(c, red),
            }


def _troubles(c: dict[str, Any], red: str) -> dict[str, Cell]:
    """A camera's reconnects, frames superseded, restarts and last error, each in its style (`red`: a lost
    or refused camera's)."""
    return {
        "reconnects": (fmt.count(int(c.get("reconnects") or 0)), red or ("yellow" if c.get("reconnects") else "dim")),
        "superseded": (fmt.rate(c.get("fps_superseded")), red or "dim"),
        "restarts": (fmt.count(int(c.get("restarts") or 0)), red or ("yellow" if c.get("restarts") else "dim")),
        "error": ("  " + fmt.printable(why(c), 300), red or "dim"),
    }


class CamerasView(Vertical):
    """A line saying how to read the table (or that there are no cameras), the table, and the
    selected camera's reason or last error in full; then the last snapshot's file, once `S` asked."""

    BINDINGS = [Binding("S", "snapshot", "snapshot")]

    class SnapshotWanted(Message):
        """`S`: the app asks the daemon for the camera's snapshot, and hands the reply to `snapshot_taken`."""

        def __init__(self, camera: str) -> None:
            super().__init__()
            self.camera = camera

    def action_snapshot(self) -> None:
        camera = self.query_one(CamerasTable).selected_key()
        if camera is None:
            self.app.notify("no camera selected", severity="warning")
            return
        self._snapshot = f"[dim]asking for a snapshot of[/] {escape(fmt.printable(camera))}…"
        self.on_cameras_table_moved()
        self.post_message(self.SnapshotWanted(camera))

    def snapshot_taken(self, camera: str, reply: dict[str, Any]) -> None:
        """Show where the daemon wrote the snapshot of `camera`, or its refusal (escaped)."""
        self._snapshot = self.snapshot_text(camera, reply)
        self.on_cameras_table_moved()
        if reply.get("ok"):  # the line may be too narrow for a long path: the notification has it whole
            self.app.notify(escape(fmt.printable(reply.get("path", "?"), 500)), title="Snapshot saved", timeout=8)

    @staticmethod
    def snapshot_text(camera: str, reply: dict[str, Any]) -> str:
        name = escape(fmt.printable(camera))
        if not reply.get("ok"):
            return f"[red]no snapshot of {name}:[/] {escape(fmt.printable(reply.get('error', '?'), 300))}"
        return f"snapshot of {name}: {escape(fmt.printable(reply.get('path', '?'), 300))}"

    DEFAULT_CSS = """
    CamerasView #cameras-head { height: 2; padding: 0 1; }
    CamerasView CamerasTable { height: 1fr; }
    CamerasView #cameras-why { height: 3; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="cameras-head")
        yield CamerasTable(id="cameras-table")
        yield Static("", id="cameras-why")

    def update_from(self, snapshot: dict[str, Any]) -> None:
        head = self.query("#cameras-head")
        if not head:  # not composed yet, or being removed as the console closes: the next snapshot
            return
        self._cameras = list(snapshot.get("cameras") or [])
        self.query_one(CamerasTable).update_from(snapshot)
        self._show(head.first(Static), "_head", self.head_text(self._cameras))
        self.on_cameras_table_moved()

    def on_cameras_table_moved(self, message: CamerasTable.Moved | None = None) -> None:
        """The selected camera's reason or last error under the table."""
        why = self.query("#cameras-why")
        if why:
            selected = self.query_one(CamerasTable).selected_key()
            text = self.why_text(getattr(self, "_cameras", []), selected)
            snapshot = getattr(self, "_snapshot", "")
            self._show(why.first(Static), "_why", "\n".join(line for line in (text, snapshot) if line))

    def _show(self, widget: Static, cache: str, text: str) -> None:
        if getattr(self, cache, None) != text:  # unchanged text: no repaint
            setattr(self, cache, text)
            widget.update(text, layout=False)

    @staticmethod
    def head_text(cameras: list[dict[str, Any]]) -> str:
        """The line above the table: how many cameras, how many in trouble, how to read it."""
        if not cameras:
            return EMPTY
        count = f"{len(cameras)} camera{'s' if len(cameras) != 1 else ''}"
        streaming = sum(1 for c in cameras if c.get("state") == "streaming")
        count += f" · {streaming} streaming"
        trouble = sum(1 for c in cameras if c.get("state") in TROUBLE)
        if trouble:
            count += f" · [bold red]{trouble} down[/]"
        return HEAD.format(n=count)

    @staticmethod
    def why_text(cameras: list[dict[str, Any]], selected: str | None) -> str:
        """The selected camera's reason or last error, then its zones' and lines' counts, escaped; ""
        when it has neither."""
        camera = next((c for c in cameras if str(c.get("camera")) == selected), None)
        if camera is None:
            return ""
        name = escape(fmt.printable(camera.get("camera", "?")))
        lines = [f"[b]{name}[/] [dim]{escape(str(camera.get('state', '')))}:[/] "
                 f"{escape(fmt.printable(why(camera), 300))}"] if why(camera) else []
        if camera.get("state") in DOWN:
            lines.append(f"[dim]{escape(NEXT_STEP)}[/]")
        counts = fmt.area_counts(camera)
        if counts:
            lines.append(f"[dim]{name}[/] " + escape(" · ".join(counts)))
        return "\n".join(lines)
