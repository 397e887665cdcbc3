"""A version's life (docs/hot-swap.md#a-versions-life): its phases and every move between them, written once.

`TABLE` is the state machine: each `Step` says from which phase which event
takes a version to which phase. The code paths that move a version —
loading (models/registry.py), the swap (swap/swapper.py), the rollout
(swap/rollout.py), promote/demote and replace (models/switch.py) — say the
move through `say`, which emits the step's event and sets the version's
`phase`; a move the table does not have is still made and said, with a
warning naming it, so that the table stays the truth and a gap shows. The
`phase` is listed by the admin `models` command beside the `state`.

docs/hot-swap.md's diagram and table are generated from `TABLE`:

    .venv/bin/python -m infermux.models.life --write

(tests/unit/models/test_life.py checks that they match).
"""

from __future__ import annotations

import enum
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("infermux.life")

COMMAND = ".venv/bin/python -m infermux.models.life --write"
DOC = Path(__file__).resolve().parents[2] / "docs" / "hot-swap.md"
BEGIN = f"<!-- generated from daemon/models/life.py by `{COMMAND}`; do not edit by hand -->"
END = "<!-- end of the generated version life -->"


class Phase(str, enum.Enum):
    """Where a version is in its life (the admin `models` command's `phase`)."""

    FOUND = "found"
    VERIFIED = "verified"
    CANDIDATE = "candidate"
    SHADOWING = "shadowing"
    PASSED = "passed"
    REFUSED = "refused"
    SERVING = "serving"
    DRAINING = "draining"
    GONE = "gone"


MEANS = {
    Phase.FOUND: "its engine file is complete (in engine_dir, or configured); not loaded yet",
    Phase.VERIFIED: "its checksum and signature check out, it loaded and warmed up",
    Phase.CANDIDATE: "loaded beside the serving version, in no routing table (state `candidate`)",
    Phase.SHADOWING: "computing copies of live requests and comparing (state `candidate`)",
    Phase.PASSED: "the gate (or `ctl promote-now`) said yes; switched in next",
    Phase.REFUSED: "the gate, `ctl reject` or its load said no: listed `failed` with the reason, kept across restarts",
    Phase.SERVING: "`ready`, in the routing tables",
    Phase.DRAINING: "out of the tables, answering what it accepted",
    Phase.GONE: "unloaded (its verdict stays)",
}


@dataclass(frozen=True)
class Step:
    """From `source`, the event `event` takes a version to `target`; `when` says when it happens."""

    source: Phase
    event: str
    target: Phase
    when: str


P = Phase
TABLE: tuple[Step, ...] = (
    Step(P.GONE, "detected", P.FOUND, "its engine file appears complete in engine_dir (again)"),
    Step(P.GONE, "loading", P.FOUND, "loaded again: on demand, by a reload, an operator, a rollback"),
    Step(P.REFUSED, "loading", P.FOUND, "an operator's load, a new file (signed in place), `ctl retry`"),
    Step(P.FOUND, "loaded", P.VERIFIED, "checksum and signature checked, loaded, warmed up; listed `serving` "
                                        "while in the routing tables (served by name, a cold one on demand)"),
    Step(P.FOUND, "failed", P.REFUSED, "checksum, signature or load failed: that file is not tried again"),
    Step(P.GONE, "failed", P.REFUSED, "its worker process crashed too often: `ctl load` tries again"),
    Step(P.PASSED, "failed", P.REFUSED, "unloaded (an operator, memory) before it was switched in"),
    Step(P.VERIFIED, "swapped", P.SERVING, "served at once: a model's first version, one without a rollout, a replacement"),
    Step(P.VERIFIED, "rolled_back", P.SERVING, "the serving version's folder was removed: the newest older one serves"),
    Step(P.VERIFIED, "promoted", P.SERVING, "moved into the daemon (`ctl promote`)"),
    Step(P.VERIFIED, "demoted", P.SERVING, "moved into a worker process (`ctl demote`)"),
    Step(P.VERIFIED, "rollout_started", P.CANDIDATE, "its model has a rollout table and a serving version"),
    Step(P.CANDIDATE, "shadowing", P.SHADOWING, "its first mirrored request was compared"),
    Step(P.CANDIDATE, "rollout_passed", P.PASSED, "`ctl promote-now` before any comparison"),
    Step(P.SHADOWING, "rollout_passed", P.PASSED, "agreed on `shadow_requests`, fast and small enough"),
    Step(P.CANDIDATE, "draining", P.DRAINING, "refused (`ctl reject`, over max_memory_mb as it loaded) or "
                                              "cancelled: its engine is released, then the verdict said"),
    Step(P.SHADOWING, "draining", P.DRAINING, "refused (it can no longer pass: agreement, speed, memory) or "
                                              "cancelled: its engine is released, then the verdict said"),
    Step(P.GONE, "rollout_failed", P.REFUSED, "the verdict on a candidate just released: listed failed, kept"),
    Step(P.GONE, "rollout_cancelled", P.GONE, "superseded, pinned out, its file removed: never judged, it "
                                              "shadows again when wanted"),
    Step(P.PASSED, "swapped", P.SERVING, "switched in: every request from now on"),
    Step(P.PASSED, "draining", P.DRAINING, "the candidate's worker, once its version, loaded afresh at the "
                                           "model's own placement and priority, serves"),
    Step(P.REFUSED, "rollout_retry", P.FOUND, "`ctl retry MODEL VERSION`: it shadows again once it loads"),
    Step(P.SERVING, "draining", P.DRAINING, "superseded, replaced, moved, removed, idle, evicted, stopping"),
    Step(P.VERIFIED, "draining", P.DRAINING, "loaded, then not wanted before it served"),
    Step(P.DRAINING, "unloaded", P.GONE, "it answered what it accepted"),
    Step(P.SERVING, "crashed", P.GONE, "its worker process died: started again by the next request"),
    Step(P.VERIFIED, "crashed", P.GONE, "its worker process died: started again by the next request"),
    Step(P.FOUND, "unloaded", P.GONE, "never loaded (a cold version nobody asked for), then not wanted"),
    Step(P.REFUSED, "unloaded", P.GONE, "its file removed: no longer listed (its verdict stays)"),
)
EVENTS = frozenset(step.event for step in TABLE)


def step(source: Phase, event: str) -> Step | None:
    """The table's step from `source` by `event`, if it has one."""
    return next((s for s in TABLE if s.source is source and s.event == event), None)


def target_of(event: str) -> Phase | None:
    """Where `event` takes a version whatever its phase, where the table says one place only."""
    targets = {s.target for s in TABLE if s.event == event}
    return targets.pop() if len(targets) == 1 else None


class Lived(Protocol):
    """A version as `say` moves it (models/version.py's ModelVersion)."""

    phase: Phase

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


class Emitter(Protocol):
    def emit(self, kind: str, model: str = "", version: str = "", **detail: Any) -> Any: ...


def say(events: Emitter, mv: Lived, event: str, **detail: Any) -> None:
    """Move `mv` by `event` as the table says, and emit the event. Saying again the event that brought it
    to its phase is no move; a move the table lacks is made (to where the event always leads) with a warning."""
    found = step(mv.phase, event)
    if found is not None:
        mv.phase = found.target
    elif not any(s.event == event and s.target is mv.phase for s in TABLE):
        target = target_of(event)
        log.warning("version life: %s:%s %s from phase %s is not in the table (models/life.py)%s", mv.name,
                    mv.version, event, mv.phase.value, f"; now {target.value}" if target is not None else "")
        if target is not None:
            mv.phase = target
    events.emit(event, mv.name, mv.version, **detail)


def say_or_emit(events: Emitter, mv: Lived | None, name: str, version: str, event: str, **detail: Any) -> None:
    """`say` where the version is listed; else only the event (a version no longer listed has no phase)."""
    if mv is not None:
        say(events, mv, event, **detail)
    else:
        events.emit(event, name, version, **detail)


def shown(phase: Phase, in_tables: bool) -> Phase:
    """The phase listed for a version: a verified one in the routing tables serves (by name, on demand)."""
    return Phase.SERVING if phase is Phase.VERIFIED and in_tables else phase


def mermaid() -> str:
    """The table as a Mermaid state diagram: one arrow per step, labelled with its event."""
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {P.FOUND.value}: detected"]
    for s in TABLE:
        if s.source is P.GONE and s.event == "detected":
            continue  # drawn as the start
        lines.append(f"    {s.source.value} --> {s.target.value}: {s.event}")
    lines += [f"    {P.GONE.value} --> [*]", "```"]
    return "\n".join(lines)


def table_markdown() -> str:
    """Every phase, what it means, and the steps out of it."""
    rows = ["| phase | what it means | leaves by (event → phase: when) |", "| --- | --- | --- |"]
    for phase in Phase:
        out = "; ".join(f"`{s.event}` → {s.target.value}: {s.when}" for s in TABLE if s.source is phase)
        rows.append(f"| {phase.value} | {MEANS[phase]} | {out} |")
    return "\n".join(rows)


def block() -> str:
    """What docs/hot-swap.md holds between BEGIN and END."""
    return "\n".join([BEGIN, "", mermaid(), "", table_markdown(), "", END])


def documented(text: str) -> str:
    """The generated block as `text` (docs/hot-swap.md) holds it; "" when it has none."""
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return found.group(0) if found else ""


def write(path: Path = DOC) -> None:
    """Replace the generated block in `path` with the table's."""
    text = path.read_text()
    old = documented(text)
    if not old:
        raise SystemExit(f"{path} has no block between {BEGIN!r} and {END!r}: add them where the diagram goes")
    path.write_text(text.replace(old, block()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(block() + "\n")
