"""infermux.vendor: the packaged console dependencies shadow older system copies."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from infermux import vendor


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", **env})


def test_vendored_module_wins_over_an_installed_one(tmp_path):
    # json is in the standard library, so it is importable without the vendor
    # dir; a vendored "json" must still be the one that gets imported.
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("VENDORED = True\n")
    # vendor.py is loaded by path: the child need not find the infermux package.
    r = _run(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("vendor", {vendor.__file__!r})
        vendor = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(vendor)
        assert vendor.activate({str(tmp_path)!r})
        import json
        print(json.VENDORED)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_missing_directory_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERMUX_VENDOR_DIR", raising=False)
    before = list(sys.path)
    assert vendor.activate(tmp_path / "absent") is False
    assert sys.path == before


def test_activate_is_idempotent_and_moves_the_entry_first(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    assert vendor.activate(tmp_path)
    assert vendor.activate(tmp_path)
    assert sys.path[0] == str(tmp_path)
    assert sys.path.count(str(tmp_path)) == 1


def test_environment_variable_overrides_the_default(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("INFERMUX_VENDOR_DIR", str(tmp_path))
    assert vendor.activate()
    assert sys.path[0] == str(tmp_path)
