"""A keyed table that redraws only the rows that changed.

Every view that lists model versions is one of these. Textual's DataTable
re-renders every visible cell whenever any cell changes (its render cache is
keyed by a table-wide update counter): 220 cells four times a second cost
over 10 % of a core. This widget uses Textual's line API instead: each row
is kept as ready-styled segments, a snapshot rebuilds only the rows whose
text or style changed, and only those lines are refreshed on screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

#: One cell: its text and its Rich style ("" for none).
Cell = tuple[str, str]


@dataclass(frozen=True)
class Col:
    """A column: key, header, width in cells (including the gap before it), alignment.

    `optional`: shown only where the terminal has room for it after every other column (not at 80)."""

    key: str
    label: str
    width: int
    right: bool = False
    optional: bool = False


def layout(columns: tuple[Col, ...], room: int) -> tuple[tuple[Col, ...], list[int]]:
    """The columns that fit `room` cells and their widths: every required one, then the optional
    ones in order while they fit; what is left widens a left-aligned first column by up to 24 cells."""
    shown = [c for c in columns if not c.optional]
    used = sum(c.width for c in shown)
    for col in columns:
        if col.optional and used + col.width <= room:
            shown.append(col)
            used += col.width
    ordered = tuple(c for c in columns if c in shown)
    widths = [c.width for c in ordered]
    if ordered and not ordered[0].right:
        widths[0] += max(0, min(room - used, 24))
    return ordered, widths


@lru_cache(maxsize=256)
def _style(text: str) -> Style:
    return Style.parse(text) if text else Style()


def fit(text: str, width: int, right: bool) -> str:
    """`text` padded or cut (with …) to exactly `width` cells."""
    if cell_len(text) > width:
        text = set_cell_size(text, width - 1) + "…" if width > 1 else set_cell_size(text, width)
    pad = width - cell_len(text)
    return " " * pad + text if right else text + " " * pad


class KeyedTable(ScrollView, can_focus=True):
    """Rows keyed by a string (usually `name:version`), columns fixed by `COLUMNS`; a row cursor."""

    COLUMNS: tuple[Col, ...] = ()

    BINDINGS = [
        Binding("enter", "select", "detail"),
        Binding("up,k", "cursor(-1)", "up", show=False),
        Binding("down,j", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "jump(0)", "first", show=False),
        Binding("end", "jump(-1)", "last", show=False),
    ]

    COMPONENT_CLASSES = {"keyed-table--header", "keyed-table--cursor"}

    DEFAULT_CSS = """
    KeyedTable { height: 1fr; scrollbar-size-vertical: 1; overflow-x: hidden; }
    KeyedTable > .keyed-table--header { text-style: bold; background: $panel; }
    KeyedTable > .keyed-table--cursor { background: $block-cursor-blurred-background; }
    KeyedTable:focus > .keyed-table--cursor {
        background: $block-cursor-background; color: $block-cursor-foreground; text-style: bold;
    }
    """

    class RowSelected(Message):
        """Enter on a row."""

        def __init__(self, table: "KeyedTable", key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._cells: dict[str, dict[str, Cell]] = {}
        self._segments: dict[str, list[Segment]] = {}
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self.cursor_row = 0
        self._columns, self._widths = layout(self.COLUMNS, 79)  # 80 columns until the first resize

    def on_resize(self) -> None:
        """Wider terminals show the optional columns, then give the name column up to 24 more cells."""
        columns, widths = layout(self.COLUMNS, self.size.width - 1)  # 1: the scrollbar
        if (columns, widths) != (self._columns, self._widths):
            self._columns, self._widths = columns, widths
            self._segments = {key: self._render_row(cells) for key, cells in self._cells.items()}
            self.virtual_size = Size(sum(widths), len(self._order) + 1)
            self.refresh()

    # -- data ---------------------------------------------------------------------

    def sync(self, rows: Iterable[tuple[str, dict[str, Cell]]]) -> None:
        """Show `rows` (key, {column key: cell}); only changed rows are redrawn."""
        rows = list(rows)
        order = [key for key, _ in rows]
        if order != self._order:
            self._rebuild(rows)
            return
        for i, (key, cells) in enumerate(rows):
            if cells != self._cells[key]:
                self._cells[key] = cells
                self._segments[key] = self._render_row(cells)
                self.refresh_line(i + 1)

    def _rebuild(self, rows: list[tuple[str, dict[str, Cell]]]) -> None:
        selected = self.selected_key()
        self._cells = {key: cells for key, cells in rows}
        self._segments = {key: self._render_row(cells) for key, cells in rows}
        self._order = [key for key, _ in rows]
        self._index = {key: i for i, key in enumerate(self._order)}
        self.virtual_size = Size(sum(self._widths), len(self._order) + 1)
        fallback = min(self.cursor_row, max(0, len(self._order) - 1))
        self.cursor_row = self._index.get(selected, fallback) if selected is not None else fallback
        self.refresh()

    def _render_row(self, cells: dict[str, Cell]) -> list[Segment]:
        segments = []
        for i, col in enumerate(self._columns):
            text, style = cells.get(col.key, ("", ""))
            if not col.right and i:
                text = " " + text  # the gap before a left-aligned column
            segments.append(Segment(fit(text, self._widths[i], col.right), _style(style)))
        return segments

    def header(self, col: Col) -> str:
        """A column's header text (a table that sorts marks its sort column here)."""
        return col.label

    def shown_columns(self) -> list[str]:
        """The keys of the columns that fit the terminal now."""
        return [c.key for c in self._columns]

    def selected_key(self) -> str | None:
        """The key of the row under the cursor, or None when the table is empty."""
        return self._order[self.cursor_row] if 0 <= self.cursor_row < len(self._order) else None

    def select(self, key: str) -> bool:
        """Put the cursor on `key`'s row; False if there is none."""
        if key not in self._index:
            return False
        self._move(self._index[key])
        return True

    def cell_text(self, key: str, column: str) -> str:
        """What a cell shows (tests read the table through this)."""
        return self._cells.get(key, {}).get(column, ("", ""))[0]

    def keys(self) -> list[str]:
        return list(self._order)

    # -- drawing ------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            header = self.get_component_rich_style("keyed-table--header")
            segments = self._render_row({c.key: (self.header(c), "") for c in self._columns})
            return Strip(segments).apply_style(base + header).extend_cell_length(width, base + header).crop(0, width)
        index = self.scroll_offset.y + y - 1
        if index >= len(self._order):
            return Strip.blank(width, base)
        strip = Strip(self._segments[self._order[index]])
        style = base + self.get_component_rich_style("keyed-table--cursor") if index == self.cursor_row else base
        return strip.apply_style(style).extend_cell_length(width, style).crop(0, width)

    # -- cursor -------------------------------------------------------------------

    def _move(self, row: int) -> None:
        if not self._order:
            return
        row = max(0, min(row, len(self._order) - 1))
        old, self.cursor_row = self.cursor_row, row
        visible = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False)
        self.refresh_line(old + 1)  # virtual lines: the header is line 0
        self.refresh_line(row + 1)

    def action_cursor(self, step: int) -> None:
        self._move(self.cursor_row + step)

    def action_page(self, step: int) -> None:
        self._move(self.cursor_row + step * max(1, self.size.height - 2))

    def action_jump(self, row: int) -> None:
        self._move(row if row >= 0 else len(self._order) - 1)

    def action_select(self) -> None:
        key = self.selected_key()
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_blur(self) -> None:
        self.refresh()

    def on_focus(self) -> None:
        self.refresh()
