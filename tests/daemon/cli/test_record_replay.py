"""Record and replay against a real daemon: `infermux record` keeps live requests and the serving
version's answers as .npz files, `infermux replay` judges another engine on them (docs/hot-swap.md)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from support import models
from support.harness import DAEMON_HEAD, Daemon

MODELS = """
[[models]]
name = "addone"
engine = "addone/1/model.onnx"
[[models]]
name = "cold"
engine = "addone/1/model.onnx"
mode = "multiproc"
preload = true
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engines")
    models.add_one(root / "addone" / "1" / "model.onnx", offset=1)
    models.add_one(root / "same" / "model.onnx", offset=1)
    models.add_one(root / "off" / "model.onnx", offset=1.5)  # every answer 0.5 away
    (root / "garbage.onnx").write_bytes(b"not an onnx model")
    return root


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engines: Path) -> Iterator[Daemon]:
    head = DAEMON_HEAD.format(engines=engines) + "record_max_bytes = 2048\n"
    d = Daemon(tmp_path_factory.mktemp("record"), head + MODELS).start()
    yield d
    assert d.stop() == 0, d.log()


def infermux(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "infermux", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def record_while_sending(daemon: Daemon, model: str, count: int, out: Path) -> tuple[tuple[int, str, str],
                                                                                      dict[int, np.ndarray]]:
    """Run `infermux record` while a pipelined client sends requests (8 in flight, each with its id) until
    it exits; returns its outcome and every input sent, by request id."""
    proc = infermux("record", model, "--count", str(count), "--out", str(out), "--endpoint", daemon.admin_endpoint)
    rng = np.random.default_rng(0)
    sent: dict[int, np.ndarray] = {}
    time.sleep(0.5)  # not needed for correctness: the recording starts with whichever request comes next
    with daemon.pipeline() as client:
        while proc.poll() is None:
            batch = []
            for _ in range(8):
                x = rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32)
                ident = client.submit(model, {"x": x})
                sent[ident] = x
                batch.append(ident)
            assert all(reply.status == 200 for reply in client.gather(batch))
    return finish(proc), sent


@pytest.mark.parametrize("model", ["addone", "cold"])
def test_record_keeps_the_next_requests_and_the_serving_versions_answers(daemon: Daemon, tmp_path: Path,
                                                                         model: str) -> None:
    (code, out, err), sent = record_while_sending(daemon, model, 12, tmp_path / "rec")
    assert code == 0, err
    assert "recorded 12 requests" in out
    manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
    assert (manifest["count"], manifest["complete"], manifest["model"], manifest["versions"]) == (12, True, model, ["1"])
    seen = [bytes(x) for x in sent.values()]
    for entry in manifest["requests"]:
        with np.load(tmp_path / "rec" / entry["file"]) as data:
            x, y = data["inputs/x"], data["outputs/y"]
        assert bytes(x) in seen  # a request some client sent, kept whole
        np.testing.assert_array_equal(y, x + 1)  # with the answer it got
        assert entry["inputs"]["x"]["shape"] == list(x.shape)


def test_replay_judges_engines_on_the_recording(daemon: Daemon, engines: Path, tmp_path: Path) -> None:
    (code, _, err), _ = record_while_sending(daemon, "addone", 10, tmp_path / "rec")
    assert code == 0, err
    same = finish(infermux("replay", str(tmp_path / "rec"), "--engine", str(engines / "same" / "model.onnx")))
    assert same[0] == 0, same
    assert "agreement 10/10 = 100.00%" in same[1] and "PASS" in same[1] and "latency per request here" in same[1]
    off = finish(infermux("replay", str(tmp_path / "rec"), "--engine", str(engines / "off" / "model.onnx")))
    assert off[0] == 1, off
    assert "agreement 0/10 = 0.00%" in off[1] and "FAIL" in off[1]
    assert "worst:" in off[1] and "output 'y': |Δ| 0.5" in off[1] and "inputs x float32[" in off[1]
    # A constant added to every score keeps each row's top-1 class: argmax agrees, allclose does not.
    top1 = finish(infermux("replay", str(tmp_path / "rec"), "--engine", str(engines / "off" / "model.onnx"),
                           "--compare", "argmax"))
    assert top1[0] == 0 and "agreement 10/10" in top1[1], top1
    loose = finish(infermux("replay", str(tmp_path / "rec"), "--engine", str(engines / "off" / "model.onnx"),
                            "--atol", "0.6", "--json"))
    assert loose[0] == 0 and json.loads(loose[1])["agreement"] == 1.0, loose


def test_record_stops_at_record_max_bytes_and_keeps_what_it_got(daemon: Daemon, tmp_path: Path) -> None:
    (code, _, err), _ = record_while_sending(daemon, "addone", 1000, tmp_path / "rec")
    assert code == 1 and "record_max_bytes reached" in err and "Traceback" not in err, err
    manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
    assert 0 < manifest["count"] < 1000 and manifest["complete"] is False
    held = sum(np.load(tmp_path / "rec" / e["file"])[k].nbytes for e in manifest["requests"]
               for k in np.load(tmp_path / "rec" / e["file"]).files)
    assert held <= 2048


@pytest.mark.parametrize("args, code, says", [
    (["record", "nosuch", "--count", "3", "--out", "{tmp}/a"], 1, "unknown model 'nosuch'"),
    (["record", "addone", "--count", "0", "--out", "{tmp}/a"], 2, "--count must be at least 1"),
    (["record", "addone", "--count", "3", "--out", "{tmp}/full"], 2, "is not an empty folder"),
    (["replay", "{tmp}/nothing", "--engine", "{engines}/same/model.onnx"], 2, "holds no manifest.json"),
    (["replay", "{tmp}/rec", "--engine", "{engines}/same/model.onnx", "--compare", "argmax", "--rtol", "1"], 2,
     "--rtol and --atol belong to --compare allclose"),
    (["replay", "{tmp}/rec", "--engine", "{engines}/missing.onnx"], 2, "is not a file"),
    (["replay", "{tmp}/rec", "--engine", "{engines}/garbage.onnx"], 1, "does not load"),
])
def test_failures_are_one_line_with_the_documented_code(daemon: Daemon, engines: Path, tmp_path: Path,
                                                        args: list[str], code: int, says: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "nothing").mkdir()
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "manifest.json").write_text(json.dumps({"format": "infermux-recording 1", "requests": []}))
    argv = [a.format(tmp=tmp_path, engines=engines) for a in args]
    if argv[0] == "record":
        argv += ["--endpoint", daemon.admin_endpoint]
    got, out, err = finish(infermux(*argv))
    assert got == code and says in err, (got, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_record_writes_private_files_never_through_a_planted_link_and_is_audited(daemon: Daemon,
                                                                                tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    out = tmp_path / "rec"
    (code, _, err), _ = record_while_sending(daemon, "addone", 3, out)
    assert code == 0, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o600}
    with daemon.admin() as admin:
        audited = [e for e in admin.call("events", limit=1000)["events"] if e["kind"] == "admin"]
    assert any(e["cmd"] == "record" and e["model"] == "addone" for e in audited), audited[-3:]
    # Another user's link where the next file goes: the write fails, the link's target is untouched.
    from infermux.client.recording import Writer
    trap = tmp_path / "trap"
    trap.mkdir(mode=0o700)
    writer = Writer(trap, "addone")
    (trap / "000000.npz").symlink_to(victim)
    with pytest.raises(FileExistsError):
        writer.add({"x": np.ones((1, 4), np.float32)}, {"y": np.ones((1, 4), np.float32)}, "1", 10)
    assert victim.read_text() == "someone else's file\n"


def test_record_refuses_a_folder_other_users_may_write(daemon: Daemon, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    got, out, err = finish(infermux("record", "addone", "--count", "1", "--out", str(shared),
                                    "--endpoint", daemon.admin_endpoint))
    assert got == 2 and "may be written by other users (mode 777)" in err and "Traceback" not in err, err


def recording_with(folder: Path, files: list[str]) -> Path:
    folder.mkdir()
    requests = [{"file": f, "version": "1", "latency_us": 1} for f in files]
    (folder / "manifest.json").write_text(json.dumps({"format": "infermux-recording 1", "model": "addone",
                                                      "requests": requests}))
    return folder


@pytest.mark.parametrize("name", ["../outside.npz", "/etc/passwd", "link.npz"])
def test_replay_reads_only_plain_files_inside_its_folder(engines: Path, tmp_path: Path, name: str) -> None:
    np.savez(tmp_path / "outside.npz", **{"inputs/x": np.ones((1, 4), np.float32)})
    rec = recording_with(tmp_path / "rec", [name])
    (rec / "link.npz").symlink_to(tmp_path / "outside.npz")
    got, _, err = finish(infermux("replay", str(rec), "--engine", str(engines / "same" / "model.onnx")))
    assert got == 1 and "not a plain file inside" in err and "Traceback" not in err, err


def test_replay_refuses_a_zip_bomb_before_decompressing_it(engines: Path, tmp_path: Path) -> None:
    rec = recording_with(tmp_path / "rec", ["000000.npz"])
    with zipfile.ZipFile(rec / "000000.npz", "w", zipfile.ZIP_DEFLATED) as bomb:  # 1 GiB of zeros in ~1 MB
        with bomb.open("inputs/x.npy", "w", force_zip64=True) as member:
            member.write(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (268435456,), }"
                         .ljust(127, b" ") + b"\n")
            zeros = bytes(1 << 24)
            for _ in range(64):
                member.write(zeros)
    assert (rec / "000000.npz").stat().st_size < 4 << 20
    got, _, err = finish(infermux("replay", str(rec), "--engine", str(engines / "same" / "model.onnx")))
    assert got == 1 and "over the 268435456 a recorded request may" in err and "Traceback" not in err, err


def test_replay_refuses_an_array_whose_header_claims_more_than_its_bound(engines: Path, tmp_path: Path) -> None:
    rec = recording_with(tmp_path / "rec", ["000000.npz"])
    with zipfile.ZipFile(rec / "000000.npz", "w") as liar:  # a few bytes that claim 40 GB
        liar.writestr("inputs/x.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, "
                                      b"'shape': (10000000000,), }".ljust(127, b" ") + b"\n" + bytes(16))
    got, _, err = finish(infermux("replay", str(rec), "--engine", str(engines / "same" / "model.onnx")))
    assert got == 1 and "its arrays take 40000000000 bytes" in err and "Traceback" not in err, err
