"""admin/threadload.py: one thread's CPU time, and the share of a core it used between reads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from infermux.admin.threadload import ThreadLoad
from infermux.cli.status import busy_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write_stat(tasks: Path, tid: int, cpu_ticks: int) -> None:
    """A /proc/<pid>/task/<tid>/stat line: utime (field 14) carries all of `cpu_ticks`, stime none."""
    fields = ["S"] + ["0"] * 10 + [str(cpu_ticks), "0"] + ["0"] * 30
    (tasks / str(tid)).mkdir(parents=True, exist_ok=True)
    (tasks / str(tid) / "stat").write_text(f"{tid} (python (x)) " + " ".join(fields) + "\n")


def test_the_share_of_a_core_is_measured_between_reads_at_least_a_second_apart(tmp_path) -> None:
    import os

    tick = os.sysconf("SC_CLK_TCK")
    clock = Clock()
    load = ThreadLoad(every_s=1.0, clock=clock, tasks=tmp_path)
    assert load.read(None) is None  # no thread yet (the frontend loop has not started)
    write_stat(tmp_path, 7, 2 * tick)
    first = load.read(7)
    assert first is not None and first.cpu_s == pytest.approx(2.0) and first.busy_ratio is None
    clock.now += 0.5
    write_stat(tmp_path, 7, 2 * tick + tick // 4)
    assert load.read(7).busy_ratio is None  # half a second: too short a window to say
    clock.now += 0.5
    write_stat(tmp_path, 7, 2 * tick + tick // 2)
    measured = load.read(7)
    assert measured.busy_ratio == pytest.approx(0.5, abs=0.02) and measured.over_s == pytest.approx(1.0)
    clock.now += 0.2
    write_stat(tmp_path, 7, 3 * tick)
    between = load.read(7)
    assert between.cpu_s == pytest.approx(3.0) and between.busy_ratio == measured.busy_ratio  # the last window's
    write_stat(tmp_path, 8, 5 * tick)
    other = load.read(8)  # another thread (a restarted loop): measured afresh
    assert other.cpu_s == pytest.approx(5.0) and other.busy_ratio is None
    (tmp_path / "8" / "stat").unlink()
    assert load.read(8) is None  # the thread is gone


def test_a_spinning_thread_is_busy_and_a_sleeping_one_is_not() -> None:
    """Real threads of this process, read from /proc: the spinner is charged the CPU it used
    (measured by itself), the sleeper none; ratios, whatever the box's load, stay within one core."""
    spent: dict[str, float] = {}
    ids: dict[str, int] = {}
    ready, done = threading.Barrier(3), threading.Event()

    def spin() -> None:
        ids["spin"] = threading.get_native_id()
        ready.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        spent["spin"] = time.thread_time() - start
        done.wait()

    def sleep() -> None:
        ids["sleep"] = threading.get_native_id()
        ready.wait()
        done.wait()

    threads = [threading.Thread(target=spin), threading.Thread(target=sleep)]
    for t in threads:
        t.start()
    ready.wait()
    loads = {name: ThreadLoad(every_s=0.05) for name in ("spin", "sleep")}
    for name, load in loads.items():
        load.read(ids[name])
    while "spin" not in spent:
        time.sleep(0.01)
    read = {name: load.read(ids[name]) for name, load in loads.items()}
    done.set()
    for t in threads:
        t.join()
    spin, sleep = read["spin"], read["sleep"]
    assert spin is not None and sleep is not None
    assert spin.busy_ratio is not None and 0 < spin.busy_ratio <= 1.05
    assert spin.cpu_s >= 0.29  # /proc counts in clock ticks
    assert sleep.busy_ratio is not None and sleep.busy_ratio <= 0.05


def test_status_says_so_only_when_the_frontend_thread_is_near_a_full_core() -> None:
    assert busy_line({}) == ""  # a daemon from before the reading
    assert busy_line({"frontend_thread": {"cpu_s": 3.0, "busy_ratio": None, "over_s": None}}) == ""
    assert busy_line({"frontend_thread": {"cpu_s": 3.0, "busy_ratio": 0.5, "over_s": 1.0}}) == ""
    line = busy_line({"frontend_thread": {"cpu_s": 3.0, "busy_ratio": 0.93, "over_s": 75.0}})
    assert line == ("frontend thread: 93% of a core over the last 1m15s; near 100% it limits the QPS "
                    "(docs/performance.md)")
