"""Signed engines against a real daemon: only what a trusted key signed is ever loaded (docs/security.md).

Unsigned, badly signed and signed-by-an-unknown-key engines are refused,
configured or published, hot or cold, and the serving version stays; a
signed one serves; what is loaded is the copy whose signature was checked,
not the published file as it is later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from infermux import signing
from support import models
from support.harness import Daemon
from support.polling import eventually
from support.publish import PROBE, publish, wait_served, write_atomically

HEAD = """
[daemon]
listen = ["ipc://infer.sock"]
engine_dir = "{root}"
engine_signing_keys = ["{key}"]
watch = {watch}
watch_settle_s = 0.4
watch_debounce_s = 0.02
watch_rescan_s = 1.0
"""


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """The trusted publisher's private key and public key, and a stranger's private key."""
    (tmp_path / "keys").mkdir()
    private, public = signing.keygen(tmp_path / "keys" / "publisher")
    stranger, _ = signing.keygen(tmp_path / "keys" / "stranger")
    return {"private": private, "public": public, "stranger": stranger}


@pytest.fixture
def start(tmp_path: Path, root: Path, keys: dict[str, Path]) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def run(models_toml: str = "", watch: bool = True) -> Daemon:
        workdir = tmp_path / f"daemon{len(started)}"
        workdir.mkdir()
        head = HEAD.format(root=root, key=keys["public"], watch=str(watch).lower())
        daemon = Daemon(workdir, head + models_toml)
        started.append(daemon)
        return daemon.start()

    yield run
    for daemon in started:
        assert daemon.stop() == 0, daemon.log()
        assert not (daemon.run_dir / "verified").exists()  # the verified copies go with the daemon


def sign(key: Path, engine: Path) -> Path:
    return signing.sign(signing.load_private(key), engine)


def status(daemon: Daemon, model: str) -> dict[str, dict]:
    with daemon.admin() as admin:
        return {m["version"]: m for m in admin.call("status")["models"] if m["name"] == model}


def ask(daemon: Daemon, model: str, version: str | None = None):  # type: ignore[no-untyped-def]
    with daemon.client() as client:
        return client.infer(model, {"x": PROBE}, version=version)


def configured(root: Path, keys: dict[str, Path], how: str) -> Path:
    """An add_one engine (offset 1) for model `how`, signed the way `how` says."""
    path = models.add_one(root / how / "1" / "model.onnx", offset=1)
    if how == "signed":
        sign(keys["private"], path)
    elif how == "stranger":
        sign(keys["stranger"], path)
    elif how == "tampered":
        sign(keys["private"], path)
        models.add_one(path, offset=9)  # changed after it was signed
    elif how == "garbled":
        path.with_name("model.onnx.sig").write_text("infermux-signature 1\nkey 0\nsignature ???\n")
    return path


MODELS = "".join(f'[[models]]\nname = "{how}"\nengine = "{how}/1/model.onnx"\nmode = "{mode}"\n'
                 for how, mode in (("signed", "inproc"), ("unsigned", "inproc"), ("stranger", "inproc"),
                                   ("tampered", "inproc"), ("garbled", "inproc"), ("cold_signed", "multiproc"),
                                   ("cold_unsigned", "multiproc")))


def test_configured_engines_load_only_with_a_valid_signature_by_a_trusted_key(
        root: Path, keys: dict[str, Path], start: Callable[..., Daemon]) -> None:
    for how in ("signed", "unsigned", "stranger", "tampered", "garbled"):
        configured(root, keys, how)
    models.add_one(root / "cold_signed" / "1" / "model.onnx", offset=1)
    sign(keys["private"], root / "cold_signed" / "1" / "model.onnx")
    models.add_one(root / "cold_unsigned" / "1" / "model.onnx", offset=1)
    daemon = start(MODELS, watch=False)
    reply = ask(daemon, "signed")
    assert reply.status == 200
    np.testing.assert_array_equal(reply.outputs["y"], PROBE + 1)
    why = {"unsigned": "model.onnx is not signed: model.onnx.sig is missing",
           "stranger": "is signed by an unknown key", "tampered": "it does not match model.onnx",
           "garbled": "bad signature"}
    for how, reason in why.items():
        (state,) = status(daemon, how).values()
        assert state["state"] == "failed" and reason in state["reason"], state
        assert state["reason"].startswith("signature check failed: ")
        assert f"failed model={how} version=1 reason=\"signature check failed: " in daemon.log()
        refused = ask(daemon, how)
        assert refused.status == 503 and reason in refused.error, refused.error
    cold = eventually(lambda: (r := ask(daemon, "cold_signed")).status == 200 and r, "the signed cold model", 30)
    np.testing.assert_array_equal(cold.outputs["y"], PROBE + 1)
    eventually(lambda: status(daemon, "cold_unsigned")["1"]["state"] == "failed" or ask(daemon, "cold_unsigned")
               and False, "the unsigned cold model refused", 30)
    assert "is not signed" in status(daemon, "cold_unsigned")["1"]["reason"]
    assert "Traceback" not in daemon.log()


def test_a_published_version_is_refused_until_it_is_signed_and_the_serving_one_stays(
        root: Path, keys: dict[str, Path], start: Callable[..., Daemon]) -> None:
    sign(keys["private"], publish(root, "m", 1, offset=1))
    daemon = start()
    wait_served(daemon, "m", "1", offset=1)
    publish(root, "m", 2, offset=2)  # unsigned
    daemon.wait_for("failed model=m version=2", 10)
    state = status(daemon, "m")
    assert state["2"]["state"] == "failed" and "model.onnx.sig is missing" in state["2"]["reason"]
    assert ask(daemon, "m").version == "1"
    sign(keys["stranger"], root / "m" / "2" / "model.onnx")  # a signature arrives: tried again, by the wrong key
    eventually(lambda: "unknown key" in status(daemon, "m")["2"]["reason"], "the stranger's signature refused", 15)
    assert ask(daemon, "m").version == "1"
    sign(keys["private"], root / "m" / "2" / "model.onnx")
    wait_served(daemon, "m", "2", offset=2)


def test_an_unsigned_replacement_of_the_serving_file_is_rejected_and_the_old_engine_serves(
        root: Path, keys: dict[str, Path], start: Callable[..., Daemon]) -> None:
    sign(keys["private"], publish(root, "m", 1, offset=1))
    daemon = start()
    wait_served(daemon, "m", "1", offset=1)
    publish(root, "m", 1, offset=5)  # replaced in place; its old .sig no longer matches
    eventually(lambda: "new engine file rejected (signature check failed: bad signature"
               in status(daemon, "m")["1"]["reason"], "the replacement rejected", 15)
    reply = ask(daemon, "m")
    assert reply.status == 200
    np.testing.assert_array_equal(reply.outputs["y"], PROBE + 1)


def test_an_edited_model_toml_voids_the_signature(root: Path, keys: dict[str, Path],
                                                  start: Callable[..., Daemon]) -> None:
    write_atomically(root / "m" / "model.toml", b"contexts = 1\n")
    sign(keys["private"], publish(root, "m", 1, offset=1))
    daemon = start()
    wait_served(daemon, "m", "1", offset=1)
    write_atomically(root / "m" / "model.toml", b'contexts = 2\nbackend = "onnxruntime"\n')
    eventually(lambda: "model.toml changed since it was signed" in status(daemon, "m")["1"]["reason"],
               "the edited model.toml refused", 15)
    assert status(daemon, "m")["1"]["contexts"] == 1  # still the signed settings
    sign(keys["private"], root / "m" / "1" / "model.onnx")
    eventually(lambda: status(daemon, "m")["1"]["contexts"] == 2, "the re-signed settings applied", 15)


def test_what_is_loaded_is_the_checked_copy_not_the_file_as_it_is_later(
        root: Path, keys: dict[str, Path], start: Callable[..., Daemon]) -> None:
    """The published file is changed in place after the check; onnxruntime opens its file again for
    each new context, and still gets the bytes that were checked."""
    path = configured(root, keys, "signed")
    daemon = start('[[models]]\nname = "signed"\nengine = "signed/1/model.onnx"\n', watch=False)
    assert ask(daemon, "signed").status == 200
    with open(path, "r+b") as f:  # the same inode, other bytes: an add_one of offset 9
        data = models.add_one(root / ".other.onnx", offset=9).read_bytes()
        f.truncate(0)
        f.write(data)
    with daemon.admin() as admin:
        admin.call("set", model="signed", contexts=3)
    with daemon.client() as client:
        for _ in range(30):  # least_queue rotates over idle contexts: every new one answers
            reply = client.infer("signed", {"x": PROBE})
            np.testing.assert_array_equal(reply.outputs["y"], PROBE + 1)
    copies = list((daemon.run_dir / "verified").iterdir())
    assert len(copies) == 1 and stat_mode(copies[0]) == 0o700


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def copy_version(root: Path, source: tuple[str, int], target: tuple[str, int]) -> Path:
    """Every file of a published version, signature included, published again under another name or version."""
    staged = root / target[0] / f".{target[1]}.tmp"
    staged.mkdir(parents=True)
    for f in (root / source[0] / str(source[1])).iterdir():
        (staged / f.name).write_bytes(f.read_bytes())
    staged.rename(root / target[0] / str(target[1]))
    return root / target[0] / str(target[1]) / "model.onnx"


def test_signed_files_copied_under_another_name_or_an_older_build_as_a_newer_version_are_refused(
        root: Path, keys: dict[str, Path], start: Callable[..., Daemon]) -> None:
    sign(keys["private"], publish(root, "sg", 1, offset=1))
    daemon = start()
    wait_served(daemon, "sg", "1", offset=1)
    sign(keys["private"], publish(root, "sg", 2, offset=2))
    wait_served(daemon, "sg", "2", offset=2)
    copy_version(root, ("sg", 1), ("other", 1))  # a signed model served under a name it was not signed for
    copy_version(root, ("sg", 1), ("sg", 9))  # v1's signed bytes as the newest version: a downgrade
    daemon.wait_for("failed model=other version=1", 15)
    daemon.wait_for("failed model=sg version=9", 15)
    assert "made for sg/1, and the engine lies in other/1" in status(daemon, "other")["1"]["reason"]
    assert "made for sg/1, and the engine lies in sg/9" in status(daemon, "sg")["9"]["reason"]
    assert ask(daemon, "sg").version == "2" and ask(daemon, "other").status in (404, 503)


def test_an_unsigned_warmup_file_voids_the_signature_and_external_weights_load_when_signed(
        root: Path, keys: dict[str, Path], start: Callable[..., Daemon]) -> None:
    path = models.external_weights(root / "ext" / ".1.tmp" / "model.onnx", offset=3)
    signing.sign(signing.load_private(keys["private"]), path, "ext", "1")  # signed for where it goes
    path.parent.rename(root / "ext" / "1")
    daemon = start()
    eventually(lambda: ask(daemon, "ext").status == 200, "the model with external weights served", 30)
    np.testing.assert_array_equal(ask(daemon, "ext").outputs["y"], PROBE + 3)
    staged = root / "ext" / ".warmup.npz.tmp"
    with open(staged, "wb") as out:
        np.savez(out, x=np.zeros((64, 4), np.float32))
    staged.rename(root / "ext" / "1" / "warmup.npz")  # planted beside the signed engine
    np.testing.assert_array_equal(ask(daemon, "ext").outputs["y"], PROBE + 3)  # the checked copy serves on
    assert daemon.stop() == 0
    daemon.start()  # at the next start the planted file is seen before anything reads it
    eventually(lambda: "warmup.npz added" in status(daemon, "ext")["1"]["reason"], "the planted file refused", 15)
    assert status(daemon, "ext")["1"]["state"] == "failed" and "Traceback" not in daemon.log()


def test_turning_signing_on_by_reload_names_at_once_the_loaded_engines_it_would_refuse(
        root: Path, keys: dict[str, Path], tmp_path: Path) -> None:
    configured(root, keys, "signed")
    configured(root, keys, "unsigned")
    models_toml = "".join(f'[[models]]\nname = "{m}"\nengine = "{m}/1/model.onnx"\n' for m in ("signed", "unsigned"))
    head = HEAD.format(root=root, key=keys["public"], watch="false")
    without = head.replace(f'engine_signing_keys = ["{keys["public"]}"]\n', "")
    (tmp_path / "d").mkdir()
    daemon = Daemon(tmp_path / "d", without + models_toml).start()
    try:
        assert ask(daemon, "unsigned").status == 200
        daemon.config_path.write_text(head + models_toml)
        with daemon.admin() as admin:
            refused = admin.call("reload")["changes"]["signing_would_refuse"]
        assert len(refused) == 1 and refused[0].startswith("unsigned:1 ") and "is not signed" in refused[0], refused
        assert "would be refused at its next load" in daemon.log()
        assert ask(daemon, "unsigned").status == 200  # what is loaded stays until its next load
    finally:
        assert daemon.stop() == 0
