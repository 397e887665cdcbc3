"""What a process costs, read from /proc: resident memory, its peak, open descriptors, its threads' nice values.

The peak (VmHWM) is reset by writing 5 to /proc/PID/clear_refs (Linux 4.0+;
the caller must own the process or be root), so a test can measure the
peak of one step rather than of the process's whole life.
"""

from __future__ import annotations

import os
from pathlib import Path


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def rss_mib(pid: int) -> float:
    """Resident memory now (VmRSS), MiB."""
    return _status_kib(pid, "VmRSS") / 1024


def peak_rss_mib(pid: int) -> float:
    """The most resident memory since start or the last `reset_peak` (VmHWM), MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def reset_peak(pid: int) -> None:
    """Start the peak (VmHWM) again from the current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def fds(pid: int) -> int:
    """Open descriptors."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def nice_values(pid: int) -> list[int]:
    """The nice value of each thread of process `pid` (field 19 of /proc/PID/task/TID/stat)."""
    values = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            values.append(int(stat.read_text().rsplit(")", 1)[1].split()[16]))
        except (OSError, IndexError):  # a thread that ended meanwhile
            continue
    return values


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used, all its threads (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s_by_nice(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) the live threads of process `pid` have used, summed by their nice value."""
    by_nice: dict[int, float] = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        nice = int(fields[16])
        by_nice[nice] = by_nice.get(nice, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return by_nice
