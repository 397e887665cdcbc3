"""Engine signatures: keys, FILE.sig, what a signature covers, the daemon's check and `infermux sign`."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from infermux import signing
from infermux.config import ModelConfig
from infermux.models.verified import EngineSigning, SignatureRefused, release


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "keys").mkdir()
    return signing.keygen(tmp_path / "keys" / "publisher")


def engine(root: Path, data: bytes = b"engine bytes", toml: str | None = None) -> Path:
    path = root / "engines" / "det" / "4" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if toml is not None:
        (root / "engines" / "det" / "model.toml").write_text(toml)
    return path


def checker(tmp_path: Path, *pubs: Path) -> EngineSigning:
    check = EngineSigning.from_files(list(pubs), tmp_path / "store")
    check.prepare()
    return check


def admit(check: EngineSigning, path: Path, from_settings: bool = False) -> Path:
    return check.admit(ModelConfig(name="det", version="4", engine=path), from_settings)


def test_keygen_writes_a_private_key_only_its_owner_reads(keys: tuple[Path, Path]) -> None:
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(FileExistsError):
        signing.keygen(private.with_suffix(""))


def test_a_signed_engine_is_admitted_as_a_private_copy_of_the_checked_bytes(tmp_path: Path,
                                                                            keys: tuple[Path, Path]) -> None:
    path = engine(tmp_path)
    signing.sign(signing.load_private(keys[0]), path)
    check = checker(tmp_path, keys[1])
    copy = admit(check, path)
    assert copy.read_bytes() == b"engine bytes" and copy != path and copy.name == "model.onnx"
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700 and stat.S_IMODE(copy.stat().st_mode) == 0o400
    release(copy)
    assert not copy.parent.exists()


@pytest.mark.parametrize("damage, why", [
    ("unsigned", "is not signed: model.onnx.sig is missing"),
    ("engine changed", "does not match model.onnx"),
    ("garbage", "not an infermux signature"),
    ("model.toml added", "model.toml changed since it was signed"),
])
def test_an_engine_without_a_valid_signature_is_refused_saying_why(tmp_path: Path, keys: tuple[Path, Path],
                                                                   damage: str, why: str) -> None:
    path = engine(tmp_path)
    sig = signing.sign(signing.load_private(keys[0]), path)
    if damage == "unsigned":
        sig.unlink()
    elif damage == "engine changed":
        path.write_bytes(b"engine bytez")
    elif damage == "garbage":
        sig.write_text("hello")
    else:
        (path.parent.parent / "model.toml").write_text("contexts = 2\n")
    check = checker(tmp_path, keys[1])
    with pytest.raises(SignatureRefused, match=why):
        admit(check, path)
    assert list(check.store.iterdir()) == []  # no copy is left behind


def test_a_signature_by_a_key_not_trusted_is_refused_naming_the_key(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    other_private, _ = signing.keygen(tmp_path / "keys" / "other")
    path = engine(tmp_path)
    signing.sign(signing.load_private(other_private), path)
    with pytest.raises(SignatureRefused, match="signed by an unknown key [0-9a-f]{16}"):
        admit(checker(tmp_path, keys[1]), path)


def test_the_signature_covers_model_toml(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = engine(tmp_path, toml='backend = "onnxruntime"\n')
    signing.sign(signing.load_private(keys[0]), path)
    check = checker(tmp_path, keys[1])
    admitted = check.admit(ModelConfig(name="det", version="4", engine=path, backend="onnxruntime"), True)
    release(admitted)
    (path.parent.parent / "model.toml").write_text('backend = "evil:Backend"\n')
    with pytest.raises(SignatureRefused, match="model.toml changed since it was signed"):
        admit(check, path)


def test_settings_read_from_another_model_toml_than_the_signed_one_are_refused(tmp_path: Path,
                                                                               keys: tuple[Path, Path]) -> None:
    """model.toml replaced, read by a scan, and put back before the check: the backend in use is not the signed one."""
    path = engine(tmp_path, toml="contexts = 1\n")
    signing.sign(signing.load_private(keys[0]), path)
    mc = ModelConfig(name="det", version="4", engine=path, backend="evil:Backend")
    with pytest.raises(SignatureRefused, match="changed between the scan that read it and the signature check"):
        checker(tmp_path, keys[1]).admit(mc, from_settings=True)


def sign_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermux", "sign", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_sign_command_makes_keys_signs_and_checks(tmp_path: Path) -> None:
    made = sign_cli("--keygen", str(tmp_path / "pub"))
    assert made.returncode == 0 and "engine_signing_keys" in made.stdout, made.stderr
    path = engine(tmp_path)
    assert sign_cli("--check", str(tmp_path / "pub.pub"), str(path)).returncode == 1
    signed = sign_cli("--key", str(tmp_path / "pub.key"), str(path))
    assert signed.returncode == 0 and path.with_name("model.onnx.sig").exists(), signed.stderr
    checked = sign_cli("--check", str(tmp_path / "pub.pub"), str(path))
    assert (checked.returncode, checked.stdout.strip()) == (0, f"ok {path}")


@pytest.mark.parametrize("args, code, says", [
    ((), 2, "one of the arguments --keygen --key --check is required"),
    (("--key", "k.key"), 2, "needs at least one engine FILE"),
    (("--key", "missing.key", "model.onnx"), 1, "missing.key"),
    (("--check", "model.onnx", "model.onnx"), 1, "is not a PEM public key"),
])
def test_sign_failures_are_one_line_with_the_documented_code(tmp_path: Path, args: tuple[str, ...], code: int,
                                                             says: str) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x")
    run = subprocess.run([sys.executable, "-m", "infermux", "sign", *args], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert run.returncode == code and says in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


def test_a_signature_holds_only_for_the_model_and_version_it_was_made_for(tmp_path: Path,
                                                                          keys: tuple[Path, Path]) -> None:
    path = engine(tmp_path)
    signing.sign(signing.load_private(keys[0]), path)
    check = checker(tmp_path, keys[1])
    for model, version in (("other", "4"), ("det", "9")):  # a copy under another name; an older build as a newer version
        moved = tmp_path / "engines" / model / version / "model.onnx"
        moved.parent.mkdir(parents=True, exist_ok=True)
        for f in path.parent.iterdir():
            (moved.parent / f.name).write_bytes(f.read_bytes())
        with pytest.raises(SignatureRefused, match=f"made for det/4, and the engine lies in {model}/{version}"):
            check.admit(ModelConfig(name=model, version=version, engine=moved), False)
    built = tmp_path / "build" / "out" / "model.onnx"  # signed where it was built, for where it will be published
    built.parent.mkdir(parents=True)
    built.write_bytes(b"engine bytes v5")
    signing.sign(signing.load_private(keys[0]), built, model="det", version="5")  # what --model/--version do
    published = tmp_path / "engines" / "det" / "5"
    built.parent.rename(published)
    release(check.admit(ModelConfig(name="det", version="5", engine=published / "model.onnx"), False))


def test_every_file_beside_the_engine_is_covered_and_copied(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = engine(tmp_path)
    (path.parent / "warmup.npz").write_bytes(b"warm-up arrays")
    (path.parent / "model.onnx.data").write_bytes(b"external weights")
    signing.sign(signing.load_private(keys[0]), path)
    check = checker(tmp_path, keys[1])
    copy = admit(check, path)
    assert sorted(p.name for p in copy.parent.iterdir()) == ["model.onnx", "model.onnx.data", "warmup.npz"]
    assert (copy.parent / "model.onnx.data").read_bytes() == b"external weights"
    release(copy)
    for damage, says in (("add", "extra.bin added"), ("change", "it does not match warmup.npz"),
                         ("remove", "model.onnx.data missing")):
        signing.sign(signing.load_private(keys[0]), path)
        if damage == "add":
            (path.parent / "extra.bin").write_bytes(b"x")
        elif damage == "change":
            (path.parent / "warmup.npz").write_bytes(b"warm-up arrayz")
        else:
            (path.parent / "model.onnx.data").rename(tmp_path / "aside")
        with pytest.raises(SignatureRefused, match=says):
            admit(check, path)
        assert list(check.store.iterdir()) == []
        (path.parent / "extra.bin").unlink(missing_ok=True)
        if (tmp_path / "aside").exists():
            (tmp_path / "aside").rename(path.parent / "model.onnx.data")


def test_a_file_of_another_size_than_signed_is_refused_before_it_is_read(tmp_path: Path,
                                                                          keys: tuple[Path, Path]) -> None:
    path = engine(tmp_path)
    signing.sign(signing.load_private(keys[0]), path)
    with open(path, "r+b") as f:  # a sparse GiB where the signed engine was
        f.truncate(1 << 30)
    check = checker(tmp_path, keys[1])
    with pytest.raises(SignatureRefused, match="it does not match model.onnx"):
        admit(check, path)
    assert list(check.store.iterdir()) == []


def test_a_first_format_signature_is_refused_saying_to_sign_again(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = engine(tmp_path)
    path.with_name("model.onnx.sig").write_text("infermux-signature 1\nkey 0123456789abcdef\nmodel.toml none\n"
                                                "signature AAAA\n")
    with pytest.raises(SignatureRefused, match="first signature format.*sign it again"):
        admit(checker(tmp_path, keys[1]), path)


def test_keys_others_may_change_or_read_are_not_used(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    private, public = keys
    public.chmod(0o666)
    assert "may be written by other users (mode 666)" in signing.key_problem(public, private=False)
    config = tmp_path / "infermux.toml"
    config.write_text(f'[daemon]\nengine_signing_keys = ["{public}"]\n')
    from infermux import config as cfg
    with pytest.raises(cfg.ConfigError, match="will not trust .* may be written by other users"):
        cfg.load(config)
    private.chmod(0o640)
    path = engine(tmp_path)
    run = sign_cli("--key", str(private), str(path))
    assert run.returncode == 1 and "will not sign with" in run.stderr and "may be read or written" in run.stderr
    assert not path.with_name("model.onnx.sig").exists()


@pytest.mark.parametrize("staged", [".4", ".4.tmp"])
def test_a_version_signed_in_its_hidden_staging_folder_holds_once_renamed_into_place(
        tmp_path: Path, keys: tuple[Path, Path], staged: str) -> None:
    path = tmp_path / "engines" / "det" / staged / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"engine bytes")
    signing.sign(signing.load_private(keys[0]), path)
    path.parent.rename(tmp_path / "engines" / "det" / "4")
    release(admit(checker(tmp_path, keys[1]), tmp_path / "engines" / "det" / "4" / "model.onnx"))


def test_an_older_signing_of_the_same_version_is_refused_across_restarts_until_signed_again(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    from infermux.models.verified import Sequences

    key = signing.load_private(keys[0])
    path = engine(tmp_path, data=b"build one")
    signing.sign(key, path)
    old = {f.name: f.read_bytes() for f in path.parent.iterdir()}
    path.write_bytes(b"build two")
    signing.sign(key, path)
    state = tmp_path / "state" / "signatures.json"
    check = EngineSigning.from_files([keys[1]], tmp_path / "store", Sequences(state))
    check.prepare()
    release(admit(check, path))
    for name, data in old.items():  # build one, with its own valid signature, put back in its place
        (path.parent / name).write_bytes(data)
    again = EngineSigning.from_files([keys[1]], tmp_path / "store2", Sequences(state))  # after a restart
    again.prepare()
    for checker_ in (check, again):
        with pytest.raises(SignatureRefused, match="an older signing of det/4 .* a downgrade"):
            admit(checker_, path)
    signing.sign(key, path)  # the rollback, on purpose
    assert admit(again, path).read_bytes() == b"build one"


def test_a_model_named_in_any_script_is_signed_and_admitted_and_a_huge_sig_is_not_read_whole(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    path = tmp_path / "engines" / "détecteur" / "4" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"engine bytes")
    signing.sign(signing.load_private(keys[0]), path)
    check = checker(tmp_path, keys[1])
    release(check.admit(ModelConfig(name="détecteur", version="4", engine=path), False))
    path.with_name("model.onnx.sig").write_bytes(b"x" * (1 << 20))
    with pytest.raises(SignatureRefused, match="not a signature"):
        check.admit(ModelConfig(name="détecteur", version="4", engine=path), False)
