"""The shipped Prometheus rules (packaging/prometheus): promtool checks them and runs their unit
tests, every alert has a firing and a quiet case and says what to do, docs/fleet.md lists each
alert with its threshold, and the package installs them.

promtool comes with Debian's `prometheus` package: installed under CI, a skip elsewhere
(tests/support/system_packages.py). tests/system/test_prometheus_scrape.py loads the same rules into a real
Prometheus scraping a real daemon.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import system_packages
from support.harness import REPO

PROMETHEUS_DIR = REPO / "packaging/prometheus"
RULES = PROMETHEUS_DIR / "infermux-rules.yml"
UNIT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def rules() -> list[dict[str, Any]]:
    """Every rule of every group, recording and alerting."""
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def thresholds(expr: str) -> list[str]:
    """The comparisons an alert's expression ends in: `> 0.05`, `== 1`."""
    return re.findall(r"(?:==|>=|<=|>|<) [0-9.]+(?=\s|$|\))", expr)


@pytest.fixture(scope="module")
def promtool() -> str:
    system_packages.require({"promtool": "prometheus"})
    path = shutil.which("promtool")
    assert path
    return path


def _promtool(promtool: str, *args: str | Path, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_checks_the_rules(promtool: str) -> None:
    r = _promtool(promtool, "check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout


def test_the_rules_pass_their_promtool_unit_tests(promtool: str) -> None:
    r = _promtool(promtool, "test", "rules", *UNIT_TESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(UNIT_TESTS), r.stdout


def test_the_unit_tests_catch_a_changed_threshold(promtool: str, tmp_path: Path) -> None:
    # The unit tests can fail: with the 5xx alert's threshold raised from 5% to 50%, its firing case does.
    text = RULES.read_text()
    assert text.count("model_version:infermux_requests_5xx:ratio_rate5m > 0.05") == 1
    (tmp_path / "tests").mkdir()
    (tmp_path / RULES.name).write_text(text.replace("ratio_rate5m > 0.05", "ratio_rate5m > 0.5"))
    for test in UNIT_TESTS:
        shutil.copy(test, tmp_path / "tests" / test.name)
    r = _promtool(promtool, "test", "rules", "tests/server-errors.yml", cwd=tmp_path)
    assert r.returncode != 0 and "alertname: InfermuxServerErrors" in r.stderr, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases: dict[str, set[str]] = {}
    for path in UNIT_TESTS:
        assert yaml.safe_load(path.read_text())["rule_files"] == ["../infermux-rules.yml"], path.name
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], set()).add("firing" if case.get("exp_alerts") else "quiet")
    assert {a["alert"]: {"firing", "quiet"} for a in alerts()} == cases


def test_every_alert_says_what_it_is_and_what_to_do() -> None:
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names)) and len(names) >= 8
    for alert in alerts():
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        summary, description = alert["annotations"]["summary"], alert["annotations"]["description"]
        assert "{{ $labels.instance }}" in summary, f"{alert['alert']}: say which box"
        # What to do: a command to run, a setting to change or a dashboard panel to read.
        assert "`" in description or "panel" in description, f"{alert['alert']}: say what to do"
        assert thresholds(alert["expr"]), f"{alert['alert']}: no threshold in {alert['expr']!r}"


def test_docs_list_each_alert_with_its_threshold_and_first_step() -> None:
    fleet = (REPO / "docs/fleet.md").read_text()
    for alert in alerts():
        rows = [line for line in fleet.splitlines() if line.startswith(f"| `{alert['alert']}` |")]
        assert len(rows) == 1, f"docs/fleet.md: one row for {alert['alert']} in the alerts table"
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", rows[0].strip("|"))]  # `\|` is a pipe in a cell
        assert len(cells) == 5, rows[0]  # alert | fires when | for | severity | first thing to do
        for threshold in thresholds(alert["expr"]):
            assert f"`{threshold}`" in cells[1], f"{alert['alert']}: docs say {cells[1]!r}, rules say {threshold}"
        assert cells[2] == alert.get("for", "—"), f"{alert['alert']}: docs say for {cells[2]}"
        assert cells[3] == alert["labels"]["severity"]
        assert len(cells[4]) > 20


def test_the_package_installs_the_rules() -> None:
    install = (REPO / "debian/infermux.install").read_text().splitlines()
    assert "packaging/prometheus/infermux-rules.yml usr/share/infermux/prometheus/" in install
    # and packaging/test-install.sh finds them in the installed package
    assert "/usr/share/infermux/prometheus/infermux-rules.yml" in (REPO / "packaging/test-install.sh").read_text()
