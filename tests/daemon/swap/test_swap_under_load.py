"""Zero-loss hot swap: pipelined clients under load through 20 consecutive swaps.

Every request must get 200; each reply names a version and carries that
version's outputs (add_one with offset = version number, so the numbers
prove which engine answered); and per client, in the order the requests
were sent, versions never go back: once a request reached the new version,
no later one reaches the old.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from support.harness import Daemon
from support.load import LoadClient
from support.publish import publish, write_atomically

SWAPS = 20
CLIENTS = 4
IN_FLIGHT = 8

CONFIG = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
watch_settle_s = 0.4
watch_debounce_s = 0.02
"""


@pytest.mark.slow
@pytest.mark.timing
def test_twenty_swaps_under_pipelined_load_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "engines"
    publish(root, "z", 1, offset=1)
    write_atomically(root / "z" / "model.toml", b"max_queue = 256\n")
    daemon = Daemon(tmp_path, CONFIG.format(root=root)).start()
    clients = [LoadClient(daemon.endpoint, i, "z", in_flight=IN_FLIGHT) for i in range(CLIENTS)]
    swap_s = []
    try:
        for client in clients:
            client.start()
        time.sleep(0.3)
        with daemon.client() as probe:
            for version in range(2, SWAPS + 2):
                published = time.monotonic()
                publish(root, "z", version, offset=version)
                while probe.infer("z", {"x": np.zeros((1, 4), np.float32)}).version != str(version):
                    assert time.monotonic() - published < 15, daemon.log()
                    time.sleep(0.005)
                swap_s.append(time.monotonic() - published)
                time.sleep(0.05)  # let the old version drain under load before the next swap
    finally:
        for client in clients:
            client.stopping.set()
        for client in clients:
            client.join(20)
        code = daemon.stop()
    assert code == 0, daemon.log()

    seen_versions: set[str] = set()
    for client in clients:
        assert client.error is None, f"client {client.index}: {client.error!r}\n{daemon.log()[-3000:]}"
        assert set(client.answers) == set(client.sent), "a request got no reply"
        previous = 0
        for ident in sorted(client.answers):
            status, version, y, error = client.answers[ident]
            assert status == 200, f"request {ident} of client {client.index}: {status} {error}"
            number = int(version)
            np.testing.assert_allclose(y, client.sent[ident] + number, rtol=1e-6)
            assert number >= previous, f"client {client.index}: version {number} after {previous}"
            previous = number
            seen_versions.add(version)
        assert len(client.answers) > 200
    # The load really spanned the swaps: nearly every version answered some request.
    assert len(seen_versions) >= SWAPS - 2, sorted(seen_versions, key=int)
    assert daemon.log().count("swapped model=z") == SWAPS
    print(f"\n{sum(len(c.answers) for c in clients)} requests, swap time median "
          f"{sorted(swap_s)[len(swap_s) // 2] * 1000:.0f} ms, max {max(swap_s) * 1000:.0f} ms")
