"""Request limits from [daemon] (docs/security.md), end to end; no unpickling anywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness import REPO
from infermux import config as cfg
from infermux.serving.server import limits_from

FILE = Path("/etc/infermux/test.toml")

LIMITS_HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{engines}"
watch = false
max_message_bytes = 4096
max_header_bytes = 512
max_tensors = 2
max_rank = 3
max_elements = 600
"""

ADDONE = """
[[models]]
name = "addone"
engine = "addone/1/model.onnx"
"""


def test_limits_default_safely_and_reach_the_protocol() -> None:
    limits = limits_from(cfg.parse("", FILE).daemon)
    assert (limits.max_message_bytes, limits.max_header_bytes, limits.max_tensors, limits.max_rank,
            limits.max_elements) == (64 << 20, 64 << 10, 64, 8, 1 << 28)
    custom = limits_from(cfg.parse("[daemon]\nmax_tensors = 3\nmax_rank = 4\nmax_elements = 99\n"
                                   "max_header_bytes = 1000\n", FILE).daemon)
    assert (custom.max_tensors, custom.max_rank, custom.max_elements, custom.max_header_bytes) == (3, 4, 99, 1000)


@pytest.mark.parametrize("text, fragment", [
    ("max_header_bytes = 10", "daemon.max_header_bytes: must be >= 256"),
    ("max_header_bytes = 2000\nmax_message_bytes = 1024", "daemon.max_header_bytes: 2000 is more than max_message_bytes"),
    ("max_tensors = 0", "daemon.max_tensors: must be >= 1"),
    ("max_tensors = '4'", "daemon.max_tensors: must be int"),
    ("max_rank = 0", "daemon.max_rank: must be >= 1"),
    ("max_rank = 65", "daemon.max_rank: must be <= 32"),
    ("max_elements = -1", "daemon.max_elements: must be >= 1"),
    ("max_elements = true", "daemon.max_elements: must be int"),
])
def test_bad_limits_are_config_errors(text: str, fragment: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse(f"[daemon]\n{text}\n", FILE)
    assert fragment in str(info.value)


def _send(client, inputs: dict[str, np.ndarray], **extra) -> tuple[int, str]:
    header = {"model": "addone", "id": 1, **extra,
              "inputs": [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in inputs.items()]}
    reply = client.send_raw([json.dumps(header).encode(), *(a.tobytes() for a in inputs.values())])
    return reply.status, reply.error or ""


def test_each_limit_refuses_a_message_over_it_and_names_itself(make_daemon) -> None:
    daemon = make_daemon(ADDONE, head=LIMITS_HEAD)
    x = np.ones((1, 4), np.float32)
    with daemon.client() as client:
        cases = {
            "max_message_bytes": _send(client, {"x": np.ones((1, 1100), np.float32)}),
            "max_header_bytes": _send(client, {"x": x}, key="p" * 600),
            "max_tensors": _send(client, {"x": x, "y": x, "z": x}),
            "max_rank": _send(client, {"x": np.ones((1, 1, 1, 4), np.float32)}),
            "max_elements": _send(client, {"x": np.ones((1, 601), np.uint8)}),
        }
        frames = _send(client, {"x": x})  # just under every limit: served
        many_frames = client.send_raw([b'{"model": "addone", "id": 2}', *([b"\0"] * 5)])
    for limit, (status, error) in cases.items():
        assert status == (413 if limit == "max_message_bytes" else 400), (limit, status, error)
        assert limit in error, (limit, error)
    assert frames == (200, "")
    assert many_frames.status == 400 and "max_tensors" in many_frames.error
    assert daemon.alive()


def test_limits_change_on_reload(make_daemon) -> None:
    daemon = make_daemon(ADDONE, head=LIMITS_HEAD)
    x = np.ones((1, 4), np.float32)
    with daemon.client() as client:
        assert _send(client, {"x": x}, key="p" * 600)[0] == 400
        daemon.config_path.write_text(daemon.config_path.read_text().replace("max_header_bytes = 512",
                                                                             "max_header_bytes = 2048"))
        daemon.admin().call("reload")
        assert _send(client, {"x": x}, key="p" * 600)[0] == 200


UNSAFE = [re.compile(p) for p in (r"\b(c?[Pp]ickle|dill|shelve|jsonpickle)\b", r"\b(recv|send)_pyobj\b",
                                  r"allow_pickle\s*=\s*True", r"\bmarshal\.loads?\b")]


def test_nothing_unpickles_or_loads_code_from_data() -> None:
    # Unpickling untrusted bytes runs code: no pickle, recv_pyobj or allow_pickle=True anywhere.
    this = Path(__file__).resolve()
    sources = [p for d in ("daemon", "plugins", "tui", "tests", "engines", "packaging")
               for p in (REPO / d).rglob("*.py") if p.resolve() != this]
    assert len(sources) > 30
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in sources
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if any(rx.search(line) for rx in UNSAFE)]
    assert not found, "\n".join(found)


def test_the_scan_would_see_each_pattern() -> None:
    # Guard the guard: each pattern matches what it is meant to catch, not allow_pickle=False.
    for line in ("import pickle", "sock.recv_pyobj()", "np.load(f, allow_pickle=True)", "marshal.loads(b)"):
        assert any(rx.search(line) for rx in UNSAFE), line
    assert not any(rx.search("np.load(f, allow_pickle=False)") for rx in UNSAFE)
