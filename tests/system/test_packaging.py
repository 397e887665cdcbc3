"""packaging/: the systemd unit, sysusers/tmpfiles, config, completion, man page, vendor pins.

The unit is checked with `systemd-analyze verify`, which needs no running
systemd but returns 0 on warnings: the test fails on any output. verify
also checks that ExecStart's binary exists, so it runs against a temporary
root (--root) holding the host's systemd units, the real /bin/kill, and a
stub /usr/bin/infermux standing in for the console script the .deb
installs (the installed unit is verified against the real one in
packaging/test-install.sh). Man-page references are checked against the
page we ship, through MANPATH.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support import system_packages

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "packaging"
UNIT = PKG / "infermux.service"
COMPLETION = PKG / "bash-completion" / "infermux"

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="systemd is Linux-only")


def _host_units() -> Path | None:
    for d in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if (d / "sysinit.target").exists():
            return d
    return None


@pytest.fixture
def verify_root(tmp_path):
    """A filesystem root for `systemd-analyze --root` and a MANPATH with our page."""
    system_packages.require({"systemd-analyze": "systemd"})
    analyze = shutil.which("systemd-analyze")
    units = _host_units()
    if not analyze or not units:
        pytest.skip("systemd's units missing (apt-get install systemd)")
    root = tmp_path / "root"
    shutil.copytree(units, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "bin").mkdir()
    shutil.copy2(shutil.which("kill", path="/bin:/usr/bin"), root / "bin/kill")
    stub = root / "usr/bin/infermux"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text("#!/bin/sh\n# stand-in for the console script the package installs\n")
    stub.chmod(0o755)
    man = tmp_path / "man" / "man1"
    man.mkdir(parents=True)
    shutil.copy2(PKG / "infermux.1", man / "infermux.1")
    return analyze, root, tmp_path / "man"


def _verify(verify_root, unit_text: str) -> tuple[int, str]:
    analyze, root, manpath = verify_root
    (root / "etc/systemd/system/infermux.service").write_text(unit_text)
    r = subprocess.run([analyze, f"--root={root}", "verify", "infermux.service"],
                       capture_output=True, text=True, env={**os.environ, "MANPATH": str(manpath)})
    return r.returncode, (r.stdout + r.stderr).strip()


@linux_only
def test_unit_verifies_without_any_output(verify_root):
    rc, output = _verify(verify_root, UNIT.read_text())
    assert output == "" and rc == 0, output


@linux_only
@pytest.mark.parametrize("breakage", [
    ("NoNewPrivileges=yes", "NoNewPrivilege=yes"),           # unknown key: a warning, rc 0
    ("char-nvhost* rw", "char-nvhost* rx"),                   # bad device rights: a warning, rc 0
    ("/usr/bin/infermux serve", "/usr/bin/infermuxd serve"),  # missing binary
])
def test_verify_harness_sees_warnings(verify_root, breakage):
    # Why the test above insists on empty output: these are real mistakes
    # that systemd-analyze reports while (mostly) returning 0.
    old, new = breakage
    text = UNIT.read_text()
    assert old in text
    _, output = _verify(verify_root, text.replace(old, new, 1))
    assert output


def _unit() -> configparser.ConfigParser:
    # DeviceAllow= repeats: keep every value, one per line.
    class MultiDict(dict):
        def __setitem__(self, key, value):
            if key in self and isinstance(value, list) and isinstance(self[key], list):
                self[key].extend(value)
            else:
                super().__setitem__(key, value)

    parser = configparser.RawConfigParser(strict=False, dict_type=MultiDict, interpolation=None)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_follows_the_design():
    s = _unit()["Service"]
    assert s["Type"] == "notify"                       # not notify-reload: systemd 252
    assert s["NotifyAccess"] == "main"
    assert s["ExecStart"].split()[:2] == ["/usr/bin/infermux", "serve"]
    assert "--config /etc/infermux/infermux.toml" in s["ExecStart"]
    assert s["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert int(s["WatchdogSec"].rstrip("s")) > 0
    assert int(s["TimeoutStartSec"].rstrip("s")) >= 120  # engine loads
    assert (s["User"], s["Group"]) == ("infermux", "infermux")
    assert set(s["SupplementaryGroups"].split()) == {"video", "render", "infermux-admin"}
    assert (s["RuntimeDirectory"], s["StateDirectory"]) == ("infermux", "infermux")
    assert s["DevicePolicy"] == "closed"
    assert s["ProtectSystem"] == "strict" and s["NoNewPrivileges"] == "yes"
    allowed = {line.split()[0] for line in s["DeviceAllow"].splitlines()}
    assert {"char-nvidia*", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvmap", "char-nvhost*"} <= allowed
    # systemd.resource-control(5): no globs in device *paths*; they would silently match nothing.
    assert not [a for a in allowed if a.startswith("/dev/") and any(c in a for c in "*?[")]


@linux_only
def test_sysusers_and_tmpfiles_make_the_user_and_tree(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown in a scratch root needs root")
    system_packages.require({"systemd-sysusers": "systemd", "systemd-tmpfiles": "systemd"})
    sysusers, tmpfiles = shutil.which("systemd-sysusers"), shutil.which("systemd-tmpfiles")
    assert sysusers and tmpfiles
    root = tmp_path
    (root / "etc").mkdir()
    for f in ("passwd", "group", "shadow", "gshadow"):
        (root / "etc" / f).touch()
    subprocess.run([sysusers, f"--root={root}", str(PKG / "infermux.sysusers")], check=True,
                   capture_output=True)
    passwd = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines()]
    user = next(p for p in passwd if p[0] == "infermux")
    assert int(user[2]) < 1000                        # a system user
    assert user[5:] == ["/var/lib/infermux", "/usr/sbin/nologin"]
    groups = {g[0]: g for g in (line.split(":") for line in (root / "etc/group").read_text().splitlines())}
    assert "infermux" in groups
    # SupplementaryGroups=video render infermux-admin fails the start if one is missing.
    for name in ("video", "render", "infermux-admin"):
        assert "infermux" in groups[name][3].split(","), groups.get(name)
    r = subprocess.run([tmpfiles, f"--root={root}", "--create", str(PKG / "infermux.tmpfiles")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr, r.stderr
    engines = (root / "var/lib/infermux/engines").stat()
    # Publishing engines is an admin's right: not the clients' group (docs/security.md).
    assert (engines.st_uid, engines.st_gid) == (int(user[2]), int(groups["infermux-admin"][2]))
    assert stat.S_IMODE(engines.st_mode) == 0o2775


def test_packaged_config_serves_a_shipped_engine():
    cfg = tomllib.loads((PKG / "infermux.toml").read_text())
    d = cfg["daemon"]
    assert d["engine_dir"] == "/var/lib/infermux/engines"
    for endpoint in [*d["listen"], d["admin"], d["stats"]]:
        # relative: lands in RuntimeDirectory=/run/infermux (or --runtime-dir)
        assert endpoint.startswith("ipc://") and not endpoint.startswith("ipc:///"), endpoint
    install = (REPO / "debian/infermux.install").read_text().split("\n")
    assert "packaging/infermux.toml etc/infermux/" in install
    assert cfg["models"]
    for model in cfg["models"]:
        engine = Path(model["engine"])
        rel = engine.relative_to("/usr/share/infermux/engines")  # read in place, package-owned
        assert (REPO / "engines" / rel).is_file()
        assert f"engines/{rel.parts[0]} usr/share/infermux/engines/" in install


def test_vendor_requirements_are_pinned_by_hash():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    text = (PKG / "vendor-requirements.txt").read_text()
    entries = [e.strip() for e in re.sub(r"\\\n", " ", text).splitlines()
               if e.strip() and not e.lstrip().startswith("#")]
    pins = {}
    for entry in entries:
        spec, *hashes = entry.split(" --hash=")
        req = Requirement(spec.strip())
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", entry
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h.strip()) for h in hashes), entry
        assert req.name not in pins, f"{req.name} pinned twice"
        pins[req.name] = next(iter(req.specifier)).version
    # The pinned console must satisfy what pyproject's tui extra asks for.
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tui"]
    wanted = Requirement(next(r for r in extra if r.startswith("textual")))
    assert SpecifierSet(str(wanted.specifier)).contains(pins["textual"])


# --- bash completion ---------------------------------------------------------

BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")


def _complete(words: list[str], *, path: str, cwd: Path | None = None, helpers: bool = False) -> list[str]:
    """COMPREPLY for the command line `words` (the last one being completed).

    helpers=True loads the bash-completion package first, as interactive
    shells do; without it the script's plain fallback runs.
    """
    system_packages.require({"bash": "bash", **({str(BASH_COMPLETION): "bash-completion"} if helpers else {})})
    bash = shutil.which("bash")
    assert bash
    line = " ".join(words).replace(" = ", "=")
    script = ((f"source {BASH_COMPLETION}\n" if helpers else "") +
              f"source {COMPLETION}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}\n"
              "_infermux; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run([bash, "--norc", "-c", script], capture_output=True, text=True,
                       env={"PATH": path, "HOME": "/nonexistent"}, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_completion_offers_subcommands():
    assert _complete(["infermux", "t"], path="/usr/bin:/bin") == ["top", "tune"]
    assert set(_complete(["infermux", ""], path="/usr/bin:/bin")) == {
        "serve", "infer", "bench", "build", "status", "ctl", "top", "tune", "keygen", "sign", "record", "replay", "doctor"}


def test_completion_reads_options_from_the_commands_help(tmp_path):
    fake = tmp_path / "bin" / "infermux"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncat <<'EOF'\nusage: infermux serve [-h] --config PATH [--runtime-dir DIR]\n\n"
                    "options:\n  -h, --help         show this help\n  --config PATH      configuration\n"
                    "  --runtime-dir DIR  sockets go here\n  --log-level LEVEL  built-in levels\nEOF\n")
    fake.chmod(0o755)
    got = _complete(["infermux", "serve", "--"], path=f"{fake.parent}:/usr/bin:/bin")
    assert got == ["--config", "--help", "--log-level", "--runtime-dir"]


def test_completion_falls_back_without_a_working_cli():
    got = _complete(["infermux", "serve", "--"], path="/nonexistent")
    assert got == ["--config", "--runtime-dir", "--help"]


@pytest.mark.parametrize("helpers", [False, True], ids=["plain", "bash-completion"])
def test_completion_of_config_paths(tmp_path, helpers):
    (tmp_path / "a.toml").write_text("")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "conf.d").mkdir()
    got = _complete(["infermux", "serve", "--config", ""], path="/usr/bin:/bin", cwd=tmp_path,
                    helpers=helpers)
    assert sorted(got) == ["a.toml", "conf.d/"]


def test_completion_of_config_equals_form(tmp_path):
    # bash splits "--config=a" at "="; bash-completion's _init_completion -s rejoins it.
    (tmp_path / "a.toml").write_text("")
    (tmp_path / "b.txt").write_text("")
    got = _complete(["infermux", "serve", "--config", "=", ""], path="/usr/bin:/bin", cwd=tmp_path,
                    helpers=True)
    assert got == ["a.toml"]


def test_every_cli_subcommand_is_completed_and_documented():
    from infermux.cli import COMMANDS

    listed = re.search(r'_infermux_commands="([^"]*)"', COMPLETION.read_text()).group(1).split()
    man = (PKG / "infermux.1").read_text()
    documented = re.findall(r"^\.TP\n\.B (\S+)$", man, flags=re.M)
    assert set(COMMANDS) <= set(listed), "add new subcommands to the bash completion"
    assert set(listed) <= set(documented), "document every subcommand in packaging/infermux.1"


def test_completion_offers_the_admin_commands_after_ctl():
    from infermux.admin.commands import COMMANDS

    assert _complete(["infermux", "ctl", "re"], path="/usr/bin:/bin") == ["reject", "retry", "reset", "resume", "reload",
                                                                         "record", "record_take", "record_stop"]
    listed = re.search(r'_infermux_ctl_commands="([^"]*)"', COMPLETION.read_text()).group(1).split()
    assert set(listed) == set(COMMANDS), "list every admin command in the bash completion"


def test_completion_reads_the_client_commands_new_flags_from_their_help():
    if not shutil.which("infermux", path=str(Path(sys.executable).parent)):
        pytest.skip("the infermux console script is not installed beside this Python")
    got = _complete(["infermux", "status", "--"], path=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    assert {"--check", "--json", "--endpoint", "--admin", "--config"} <= set(got)
    got = _complete(["infermux", "ctl", "--t"], path=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    assert got == ["--timeout"]


def test_completion_offers_the_stream_options_and_image_files_for_a_pipeline(tmp_path):
    if not shutil.which("infermux", path=str(Path(sys.executable).parent)):
        pytest.skip("the infermux console script is not installed beside this Python")
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    assert _complete(["infermux", "bench", "--str"], path=path) == ["--streams"]
    assert {"--fps", "--key-prefix", "--image"} <= set(_complete(["infermux", "bench", "--"], path=path))
    assert _complete(["infermux", "bench", "ocr", "--streams", ""], path=path) == []  # a number: nothing to offer
    for name in ("page.png", "cam.jpg", "notes.txt"):
        (tmp_path / name).write_text("")
    for command in ("bench", "infer"):
        got = _complete(["infermux", command, "ocr", "--image", ""], path=path, cwd=tmp_path)
        assert sorted(got) == ["cam.jpg", "page.png"]


def test_man_page_documents_the_pipeline_and_stream_options():
    page = (PKG / "infermux.1").read_text().replace("\\-", "-")
    for option in ("--image", "--key", "--streams", "--fps", "--duration", "--key-prefix", "--size"):
        assert re.search(rf"(?<![\w-]){option}(?![\w-])", page), f"document {option} in packaging/infermux.1"
    for words in ("[[pipelines]]", "queue_policy", "newest_per_key", "ctl streams", "stream_silent"):
        assert words in page, f"packaging/infermux.1 should mention {words}"


def test_man_page_renders_without_warnings():
    system_packages.require({"man": "man-db"})
    man = shutil.which("man")
    assert man
    r = subprocess.run([man, "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(PKG / "infermux.1")],
                       capture_output=True, text=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0 and r.stderr == "", r.stderr


def _man_section(name: str) -> str:
    """The text of one `.SH name` section of the man page."""
    page = (PKG / "infermux.1").read_text()
    return page.split(f".SH {name}\n", 1)[1].split("\n.SH ", 1)[0]


def test_man_page_documents_exit_status_every_variable_read_and_examples():
    exit_status = _man_section("EXIT STATUS")
    assert all(f".B {code}\n" in exit_status for code in "0123")
    read = set()
    for tree in ("daemon", "tui", "plugins"):
        for path in (REPO / tree).rglob("*.py"):
            read |= set(re.findall(r'environ(?:\.get)?[\[(]"([A-Z][A-Z0-9_]+)"', path.read_text()))
    environment = _man_section("ENVIRONMENT")
    documented = set(re.findall(r"^\.B ([A-Z][A-Z0-9_]+)$", environment, re.M))
    assert {"INFERMUX_CONFIG", "NO_COLOR"} <= documented
    assert read - documented == set(), "document every environment variable the code reads"
    examples = _man_section("EXAMPLES")
    for command in ("status", "ctl", "top"):
        assert f"infermux {command} " in examples


def test_package_ships_the_readme_and_docs_the_man_page_names():
    shipped = (REPO / "debian" / "infermux.docs").read_text().split()
    assert "README.md" in shipped and "docs" in shipped  # dh_installdocs copies docs/ as a folder
    assert (REPO / "README.md").is_file() and list((REPO / "docs").glob("*.md"))
    assert "dh_compress -X.md" in (REPO / "debian" / "rules").read_text()  # links between them keep working
    page = (PKG / "infermux.1").read_text()
    assert "/usr/share/doc/infermux/README.md" in page and "/usr/share/doc/infermux/docs/" in page
    for doc in re.findall(r"^\.BR? ([a-z\\-]+)\.md", page, re.M):
        assert (REPO / "docs" / f"{doc.replace(chr(92), '')}.md").is_file(), doc
    for named in re.findall(r"/usr/share/doc/infermux/([\w/.-]+\.md)", (REPO / "debian/README.Debian").read_text()):
        assert (REPO / named).is_file(), f"README.Debian names {named}, which the package does not ship"


def test_every_python_package_in_the_tree_is_installed() -> None:
    # The package list is explicit (three source folders map onto one `infermux` package): a new
    # subpackage missing from it works in the editable checkout and fails in the wheel, the .deb
    # and the container with "No module named ...", as infermux.pipelines once did.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {folder: name for name, folder in project["package-dir"].items()}
    found = set()
    for folder, name in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *parts)))
    assert found - set(project["packages"]) == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_sdist_carries_its_build_backend_the_c_source_and_the_stub(tmp_path):
    """The container image builds infermux from its sdist: one without packaging/infermux_build.py (the
    backend pyproject.toml names) cannot be built at all. Made from a clean copy of the tracked files, as
    a fresh clone has no egg-info whose file list could hide a missing one."""
    import tarfile

    tree = tracked_tree(tmp_path / "tree")
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'packaging'); import infermux_build; "
                    "print(infermux_build.build_sdist(sys.argv[1]))", str(out)], cwd=tree, check=True,
                   capture_output=True, timeout=120)
    (archive,) = out.glob("infermux-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "packaging/infermux_build.py", "daemon/transport/_wire.c",
            "daemon/transport/_wire.pyi", "daemon/transport/wire.py"} <= names


def test_without_a_c_compiler_the_wheel_builds_and_its_daemon_says_it_runs_pyzmqs_calls(tmp_path):
    """The extension is optional: where the compiler fails (none installed, as in a container whose apt
    could not fetch one), the wheel still builds, without the module, and the daemon it installs runs
    pyzmq's calls and says what to install. Built from a clean copy of the tracked files."""
    import zipfile

    tree = tracked_tree(tmp_path / "tree")
    out = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
                            "-w", str(out), str(tree)], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "CC": "false"})
    assert built.returncode == 0, built.stderr[-3000:]
    assert "building extension \"infermux.transport._wire\" failed" in built.stdout + built.stderr  # said so
    (wheel,) = out.glob("infermux-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    assert "infermux/transport/wire.py" in names
    assert not [n for n in names if n.startswith("infermux/transport/_wire") and n.endswith(".so")], names
    doctor = subprocess.run([sys.executable, "-c", "from infermux.cli.doctor import _wire; import infermux; "
                             "print(infermux.__file__); print(_wire())"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert doctor.returncode == 0, doctor.stderr[-2000:]
    where, check = doctor.stdout.splitlines()
    assert where.startswith(str(tmp_path / "site"))  # the wheel's package, not this checkout's
    assert "WARN" in check and "not installed" in check and "C compiler" in check, check


def tracked_tree(tree: Path) -> Path:
    """A copy of this checkout's tracked files: what a fresh clone holds, with no build outputs."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    return tree
