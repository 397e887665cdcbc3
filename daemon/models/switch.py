"""Load beside, switch, drain: how what serves a version is replaced without losing a request.

Every replacement of a serving version goes through one `Switch`: a reload
that changes its engine (`Registry.replace`), a hot swap of its file
(swap/swapper.py), a promote or demote between placements (models/promote.py).
The three steps can be called apart, so that a candidate can be loaded
beside the serving version and switched in only later (or never):

1. `load_beside(config)`: a candidate `ModelVersion`, loaded and warmed up
   in its placement but served by nobody: it is not in the registry's
   tables. It comes back `ready`, or `failed` with the reason; either way
   what serves is untouched.
2. `switch(candidate)`: the candidate becomes its version's entry in one
   assignment (`Registry.put`): every admission from now on reaches it. The
   entry it replaced hands its placement over to the candidate's
   (`Placement.hand_over`), so a request that still reaches the old one
   once it stops taking work is served by the new one, not refused. Returns
   the entry it replaced, which the caller drains.
3. `drain(old)`: waits for the frontend's barrier (`quiesce`: no admission
   still holds `old` after it), then `old` answers what it accepted and
   unloads.

Two switches of the same version at once are safe: each drains the entry it
replaced, so nothing is left loaded and unserved.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from infermux.config import ModelConfig
from infermux.execution.hooks import Quiesce
from infermux.models import life
from infermux.models.version import ModelVersion, State

if TYPE_CHECKING:
    from infermux.models.registry import Registry

log = logging.getLogger("infermux.switch")


class Switch:
    """Load beside, switch, drain, for one registry; `quiesce` is the frontend's barrier."""

    def __init__(self, registry: "Registry", quiesce: Quiesce) -> None:
        self.registry = registry
        self.quiesce = quiesce

    def load_beside(self, config: ModelConfig, like: ModelVersion | None = None) -> ModelVersion:
        """A candidate for `config`, loaded but not served; check `.ready` (else `.reason` says why).

        `like`: the version it will stand in for keeps one history whichever placement serves
        it (promote/demote): the candidate takes over its statistics and its last use.
        """
        candidate = ModelVersion(config)
        if like is not None:
            candidate.carry_on(like)
        self.registry.load(candidate)
        return candidate

    def switch(self, candidate: ModelVersion, reason: str = "replaced") -> ModelVersion | None:
        """Serve `candidate` (ready) from the next admission on; returns the entry it replaced."""
        successor = candidate.placement
        if not candidate.ready or successor is None:
            raise ValueError(f"{candidate.name}:{candidate.version} is {candidate.state.value}: only a loaded "
                             "candidate can be switched in")
        previous = self.registry.put(candidate)
        placement = previous.placement if previous is not None else None
        if placement is not None:
            placement.hand_over(successor, reason)
        return previous

    def drain(self, old: ModelVersion, reason: str = "replaced") -> None:
        """Once no admission can reach `old` (it left the tables before this call), let it answer
        what it accepted, and unload it."""
        if not self.quiesce():
            log.warning("the frontend did not finish its turn in time; draining %s:%s anyway (what still "
                        "reaches it goes to its successor)", old.name, old.version)
        if old.placement is None:  # never loaded (a cold version nobody asked for yet)
            old.state = State.UNLOADED
            life.say(self.registry.events, old, "unloaded", reason=reason)
            return
        self.registry.unload(old, self.registry.config.daemon.drain_timeout_s, reason=reason)

    def replace(self, config: ModelConfig, reason: str = "replaced") -> bool:
        """All three: load `config` beside what serves its version, switch, drain; False (and
        nothing changed) if the candidate failed to load or warm up."""
        candidate = self.load_beside(config)
        if not candidate.ready:
            return False
        previous = self.switch(candidate, reason)
        life.say(self.registry.events, candidate, "swapped", engine=str(config.engine))
        if previous is not None:
            self.drain(previous, reason)
        self.registry.check_fallbacks(config.name)  # the new engine may take other inputs
        return True

    def move(self, version: ModelVersion, placement: str, reason: str) -> ModelVersion:
        """Serve a ready `version` from `placement` instead (promote/demote); returns the entry now
        serving it. ValueError, with the old placement still serving, if the new one fails."""
        candidate = self.load_beside(replace(version.config, placement=placement), like=version)
        if not candidate.ready:
            raise ValueError(f"the new placement failed ({candidate.reason})")
        previous = self.switch(candidate, reason)
        if previous is not None:
            self.drain(previous, reason)
        return candidate
