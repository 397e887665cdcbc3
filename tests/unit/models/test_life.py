"""The version life's table (models/life.py): the docs' diagram is drawn from it, the code says its moves
through it, and it has no phase a version cannot leave or reach."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from infermux.models import life
from infermux.models.life import Phase

ROOT = Path(__file__).resolve().parents[3]
# Events of the table a code path emits without a version object to move: the file found (no version is
# made for it yet), a model's settings that did not apply, a retry of a version no longer listed, a crash of
# a worker that no longer serves its version, the daemon's own drain.
PLAIN = {("swapper.py", "detected"), ("swapper.py", "failed"), ("pool.py", "crashed"), ("app.py", "draining")}


def test_the_diagram_and_table_in_the_docs_are_the_ones_the_table_draws() -> None:
    committed = life.documented((ROOT / "docs" / "hot-swap.md").read_text())
    assert committed == life.block(), f"docs/hot-swap.md's version life is out of date: run `{life.COMMAND}`"


def test_every_event_of_the_table_is_said_by_some_code_path_and_none_around_it() -> None:
    said: set[str] = set()
    plain: set[tuple[str, str]] = set()
    for path in (ROOT / "daemon").rglob("*.py"):
        text = path.read_text()
        said |= set(re.findall(r'life\.say\([^,]+, [^,]+, "([a-z_]+)"', text))
        said |= set(re.findall(r'life\.say_or_emit\([^"]+"([a-z_]+)"', text))
        said |= set(re.findall(r'"promoted" if placement == HOT else "(demoted)"', text))  # promote.py: one call
        plain |= {(path.name, e) for e in re.findall(r'\.emit\("([a-z_]+)"', text) if e in life.EVENTS}
    assert life.EVENTS - said <= {"detected"}, life.EVENTS - said
    assert plain <= PLAIN, plain - PLAIN


def test_every_phase_is_reached_and_left_and_every_move_is_one_event() -> None:
    sources, targets = {s.source for s in life.TABLE}, {s.target for s in life.TABLE}
    assert set(Phase) == sources == targets | {Phase.GONE}
    pairs = [(s.source, s.event) for s in life.TABLE]
    assert len(pairs) == len(set(pairs)), "a phase and an event lead to one place only"


class Version:
    def __init__(self, phase: Phase) -> None:
        self.phase, self.name, self.version = phase, "m", "2"


class Events:
    def __init__(self) -> None:
        self.said: list[tuple[str, str, str, dict[str, Any]]] = []

    def emit(self, kind: str, model: str = "", version: str = "", **detail: Any) -> None:
        self.said.append((kind, model, version, detail))


def test_say_moves_as_the_table_says_and_warns_of_a_move_it_lacks(caplog: pytest.LogCaptureFixture) -> None:
    events, mv = Events(), Version(Phase.CANDIDATE)
    with caplog.at_level(logging.WARNING, "infermux.life"):
        life.say(events, mv, "shadowing", shadow_requests=5)
        assert mv.phase is Phase.SHADOWING and not caplog.records
        life.say(events, mv, "rollout_passed")
        life.say(events, mv, "swapped")
        life.say(events, mv, "swapped")  # said again: no move, no warning
        assert mv.phase is Phase.SERVING and not caplog.records
        life.say(events, mv, "rollout_started")  # a serving version made a candidate: not in the table
    assert mv.phase is Phase.CANDIDATE
    assert "m:2 rollout_started from phase serving is not in the table" in caplog.text
    assert [kind for kind, *_ in events.said] == ["shadowing", "rollout_passed", "swapped", "swapped",
                                                  "rollout_started"]
    assert events.said[0] == ("shadowing", "m", "2", {"shadow_requests": 5})
