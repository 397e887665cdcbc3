"""Request limits from [daemon] (docs/security.md), end to end; no unpickling anywhere."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import zmq

from support.harness import REPO
from support.polling import eventually
from infermux import config as cfg
from infermux.frontend.server import limits_from

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
        assert _send(client, {"x": x}, id="p" * 600)[0] == 400
        daemon.config_path.write_text(daemon.config_path.read_text().replace("max_header_bytes = 512",
                                                                             "max_header_bytes = 2048"))
        daemon.admin().call("reload")
        assert _send(client, {"x": x}, id="p" * 600)[0] == 200


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


# -- names, links and refusals that reach logs and metrics ---------------------------

def test_a_scanner_with_fresh_curve_keys_gets_a_few_lines_then_a_count(tmp_path: Path, caplog) -> None:
    from infermux.events import EventLog
    from infermux.transport.curve import CurveGuard

    guard = CurveGuard(zmq.Context.instance(), tmp_path / "server.key_secret", tmp_path, EventLog())
    guard.refusals.interval_s = 0.2  # a short interval, so that its summary comes while we wait
    caplog.set_level(logging.WARNING, "infermux.curve")
    for i in range(300):
        assert guard.callback("*", b"%040d" % i) is False
    eventually(lambda: "refused 295 more" in caplog.text, "the interval's summary line, from its timer")
    guard.stop()
    assert caplog.text.count("refused CURVE client key") == 5  # not 300 lines
    assert caplog.text.count("refused 295 more CURVE connection(s)") == 1


def test_prometheus_label_values_are_escaped() -> None:
    from infermux.admin.metrics import Exposition

    out = Exposition()
    out.family("infermux_x", "gauge", "x", [({"model": 'a"b\\c\nd'}, 1)])
    assert out.text().splitlines()[-1] == 'infermux_x{model="a\\"b\\\\c\\nd"} 1'


@pytest.mark.parametrize("field", ["name", "version"])
def test_a_configured_name_with_control_characters_is_a_config_error(field: str) -> None:
    entry = {"name": "m", "version": "1", field: "x\x1b[2J"}
    text = "[[models]]\n" + "".join(f'{k} = "{v}"\n' for k, v in entry.items()) + 'engine = "m.onnx"\n'
    with pytest.raises(cfg.ConfigError, match="holds control characters"):
        cfg.parse(text.replace("\x1b", "\\u001b"), FILE)


def _linked_engine_dir(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "engines", tmp_path / "elsewhere"
    (outside / "1").mkdir(parents=True)
    (outside / "1/model.onnx").write_bytes(b"onnx")
    (root / "inside/1").mkdir(parents=True)
    (root / "inside/1/model.onnx").write_bytes(b"onnx")
    (root / "linked").symlink_to(outside)
    (root / "alias").symlink_to(root / "inside")  # a link within engine_dir: nothing to say
    return root, outside


@pytest.mark.parametrize("follow", [True, False])
def test_links_out_of_engine_dir_are_logged_once_and_refused_when_told(tmp_path: Path, caplog,
                                                                       follow: bool) -> None:
    from infermux.swap.repository import FolderScreen
    from infermux.swap.watcher import Settler, scan

    root, outside = _linked_engine_dir(tmp_path)
    daemon = cfg.DaemonConfig(engine_dir=root, follow_symlinks=follow)
    screen = FolderScreen()
    caplog.set_level(logging.WARNING, "infermux.swap")
    for _ in range(2):  # a rescan says nothing new
        served = {m for m, _ in screen.apply(scan(root, Settler(0.0)), daemon).engines}
    assert served == ({"inside", "alias", "linked"} if follow else {"inside", "alias"})
    said = [r.getMessage() for r in caplog.records]
    expected = (f"{root / 'linked'} is a symlink to {outside}, outside engine_dir {root}: serving it" if follow
                else f"refused {root / 'linked'}: a symlink to {outside}, outside engine_dir {root} "
                     f"(follow_symlinks = false)")
    assert len(said) == 1 and said[0].startswith(expected), said


def test_follow_symlinks_and_admin_group_are_read_and_checked() -> None:
    daemon = cfg.parse('[daemon]\nfollow_symlinks = false\nadmin_group = "ops"\n', FILE).daemon
    assert (daemon.follow_symlinks, daemon.admin_group) == (False, "ops")
    assert (cfg.DaemonConfig().follow_symlinks, cfg.DaemonConfig().admin_group) == (True, "infermux-admin")
    with pytest.raises(cfg.ConfigError, match="daemon.follow_symlinks"):
        cfg.parse('[daemon]\nfollow_symlinks = "no"\n', FILE)
