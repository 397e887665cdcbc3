"""What the layers below the frontend may ask of it: one `FrontendHooks`, handed down once.

The frontend (frontend/server.py) builds it and gives it to the registry,
which gives it to both placers; a worker process builds its own for the
hot placement it runs (workers/child.py). So a placement is made with one
object instead of a parameter per callback, and a new callback is one more
field here, not one more parameter through every constructor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from infermux.execution.executor import LateFn, ReplyFn
from infermux.execution.inline import HoldFn, InlineGate

# watch(fd, on_ready): call on_ready() on the frontend thread whenever fd is readable, until it
# returns False (Server.watch). A cold placement reads its worker's fast lane so.
Watch = Callable[[int, Callable[[], bool]], None]

# quiesce(): return once the frontend has finished the admission it may be in the middle of, so
# that what was taken out of the routing tables before the call is out of every admission's reach
# after it; False if the frontend did not turn in time (Server.quiesce).
Quiesce = Callable[[], bool]


def no_frontend() -> bool:
    """The `quiesce` of a registry without a frontend loop: no admission can be in progress."""
    return True


@dataclass(frozen=True)
class FrontendHooks:
    """The frontend's callbacks, as placements, the registry and the switch use them.

    - `reply(to, frames, outcome=None)`: send a reply where `to` says (job.ReplyTo), from any thread (`ReplyFn`);
    - `on_late(job)`: a request found past its deadline before it was computed: the
      router's fallback, else 504 (`LateFn`);
    - `inline(expected_us, batching)`: may the calling thread compute this request itself
      now (`InlineGate`, inline.py)? None: never;
    - `hold(scheduler)`: keep a batched model's request for the end of this burst of reads
      (`HoldFn`)? None: never;
    - `watch(fd, on_ready)`: poll `fd` on the frontend thread (`Watch`); a cold placement
      needs it for its worker's lane, None where there is no frontend loop;
    - `quiesce()`: the frontend's barrier (`Quiesce`), what the switch waits on before it
      drains what it switched away from (models/switch.py).
    """

    reply: ReplyFn
    on_late: LateFn
    inline: InlineGate | None = None
    hold: HoldFn | None = None
    watch: Watch | None = None
    quiesce: Quiesce = no_frontend
