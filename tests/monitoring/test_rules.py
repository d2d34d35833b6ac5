"""The alert rules: Prometheus's own checker accepts them, each has a summary and a runbook section that
exists, and their unit tests (deploy/prometheus/alerts_test.yml) see every alert fire, and not too soon."""

from __future__ import annotations

import re
import unicodedata

import yaml

from tests.monitoring.prometheus import (
    ALERTS,
    ALERTS_TEST,
    RUNBOOK,
    SCRAPE_CONFIG,
    alert_rules,
    load_yaml,
    promtool,
)
from tests.support.paths import ROOT

RUNBOOK_BASE = "docs/operations.md#"
SEVERITIES = {"critical", "warning"}


def github_anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, `-1` on repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        text = re.sub(r"`([^`]*)`", r"\1", match.group(1)).strip().lower()
        slug = "".join(
            char
            for char in text
            if char in " -_" or unicodedata.category(char)[0] in "LN" or unicodedata.category(char) == "Mn"
        ).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_the_anchors_are_githubs() -> None:
    anchors = github_anchors(
        "# Operations: the runbook\n## Failover (a member dies)\n## The API answers 5xx\n"
    )
    assert anchors == {"operations-the-runbook", "failover-a-member-dies", "the-api-answers-5xx"}
    assert github_anchors("## Backup\n```\n## not a heading\n```\n## Backup\n") == {"backup", "backup-1"}


def test_promtool_accepts_the_rules_and_the_scrape_config() -> None:
    rules = promtool("check", "rules", str(ALERTS))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in rules.stdout + rules.stderr
    # --syntax-only: the config's token file is a deployment's (/etc/prometheus/…), absent here.
    config = promtool("check", "config", "--syntax-only", str(SCRAPE_CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_alert_has_a_severity_a_templated_summary_and_a_runbook_section_that_exists() -> None:
    anchors = github_anchors(RUNBOOK.read_text())
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == {
        "BetterComputeWorkerBehind",
        "BetterComputeOutboxStale",
        "BetterComputePoolLowOnGPUs",
        "BetterComputeReservationsAtRisk",
        "BetterComputeNodesDisconnected",
        "BetterComputeApiErrors",
        "BetterComputeCreateLatencyHigh",
    }
    runbooks = set()
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) >= {"summary", "runbook"}, name
        assert "{{" in annotations["summary"], f"{name}: the summary names what fired"
        runbook = annotations["runbook"]
        assert runbook.startswith(RUNBOOK_BASE), (name, runbook)
        assert runbook.removeprefix(RUNBOOK_BASE) in anchors, f"{name}: no heading for {runbook}"
        runbooks.add(runbook)
    assert len(runbooks) == len(rules), "one runbook section per alert"
    # The pool alerts name the pool; the worker's alert says for how long.
    by_name = {rule["alert"]: rule for rule in rules}
    assert "$labels.pool" in by_name["BetterComputePoolLowOnGPUs"]["annotations"]["summary"]
    assert by_name["BetterComputeWorkerBehind"]["expr"].strip().endswith("better_compute_worker_behind) == 1")
    assert by_name["BetterComputeWorkerBehind"]["for"] == "1m"


def test_the_rules_unit_tests_pass_and_see_every_alert_fire() -> None:
    result = promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    tests = load_yaml(ALERTS_TEST)["tests"]
    checks = [check for test in tests for check in test["alert_rule_test"]]
    fired = {check["alertname"] for check in checks if check["exp_alerts"]}
    quiet = {check["alertname"] for check in checks if not check["exp_alerts"]}
    every = {rule["alert"] for rule in alert_rules()}
    # Each alert is seen firing, and seen not firing before it should (its `for:`, its threshold).
    assert fired == every
    assert quiet == every


def test_the_readmes_scrape_config_is_the_shipped_one() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Monitoring\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    pasted = yaml.safe_load(block)["scrape_configs"]
    assert pasted == load_yaml(SCRAPE_CONFIG)["scrape_configs"]
