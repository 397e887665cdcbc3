"""`lower_process`: every thread of another process at a lower CPU priority, the threads it makes later too."""

from __future__ import annotations

import os
import subprocess
import sys

from infermux.execution.priority import lower_process
from support.polling import eventually
from support.procfs import nice_values

# Two threads before it is lowered; a third made after, which inherits its maker's value.
CHILD = ("import sys, threading\n"
         "gate = threading.Event()\n"
         "threading.Thread(target=gate.wait, daemon=True).start()\n"
         "print('up', flush=True)\n"
         "sys.stdin.readline()\n"
         "threading.Thread(target=gate.wait, daemon=True).start()\n"
         "print('more', flush=True)\n"
         "sys.stdin.readline()\n")


def test_every_thread_of_a_process_is_lowered_and_the_threads_it_makes_later_inherit_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "up"
        low = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + 6)  # this process's nice value plus 6
        lower_process(child.pid, 6, "a test's child")
        assert nice_values(child.pid) == [low, low], nice_values(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "more"
        eventually(lambda: nice_values(child.pid) == [low] * 3, "three threads, all lowered")
        lower_process(child.pid, 0, "nothing")  # 0: left as it is
        assert set(nice_values(child.pid)) == {low}
    finally:
        child.kill()
        child.wait()
