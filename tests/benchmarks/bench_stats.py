"""Cost of `Stats.record` on the hot path, with one and two recording threads.

    python tests/benchmarks/bench_stats.py

Target: under 2 µs per record with 2 threads. Writes the
"## Stats: cost per record" section of RESULTS.md.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import markdown_table, print_and_write, stamp  # noqa: E402

from infermux.execution.stats import ModelStats, Stats  # noqa: E402

RECORDS = 300_000


def per_record_us(threads: int, batch: bool) -> float:
    """Wall time per request while `threads` threads record into one Stats at full speed.

    With `batch`, each request also records its (unbatched) backend call,
    as the executor does: record_batch + record.
    """
    stats = Stats()
    start = threading.Barrier(threads + 1)

    def work() -> None:
        start.wait()
        for i in range(RECORDS):
            if batch:
                stats.record_batch(1, 800)
            stats.record(200, 900 + (i & 255), 100, 800, 1)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return (time.perf_counter() - t0) / (threads * RECORDS) * 1e6


def snapshot_ms(contexts: int) -> float:
    """Time of one full ModelStats snapshot with every ring full."""
    model = ModelStats("m", "1")
    for _ in range(contexts):
        ctx = model.add_context()
        for i in range(8192):
            ctx.record(200, i, 10, 90, 1)
    t0 = time.perf_counter()
    for _ in range(20):
        model.snapshot()
    return (time.perf_counter() - t0) / 20 * 1e3


def main() -> None:
    rows = [[f"{n}", "yes" if batch else "no", f"{per_record_us(n, batch):.2f}"]
            for n in (1, 2) for batch in (False, True)]
    table = markdown_table(["threads", "+ record_batch(1, …)", "µs per request"], rows)
    snap = f"{snapshot_ms(2):.2f}"
    body = (f"{stamp()}\n\n{table}\n\n"
            f"`ModelStats.snapshot()` with 2 contexts and full rings (4096 samples each): {snap} ms.\n"
            "µs per request = wall time / requests, all threads recording flat out (worst case).")
    print_and_write("Stats: cost per record", body, write=True)


if __name__ == "__main__":
    main()
