"""deploy/grafana/parityserve.json imports as is and reads only what parityserve exports;
deploy/prometheus/rules.yml passes promtool and reads only exported or recorded series."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from parityserve.runtime.modelpath.metrics import Metrics
from tests.unit.deploy.promql_exprs import (
    DASHBOARD,
    RULES,
    dashboard_exprs,
    exported_names,
    metric_names,
    panels,
    rules,
)

ROWS = ["Traffic and answers", "Latency against the SLO", "Redundancy", "Replicas",
        "Parallelism (SERF)", "Stateful graphs (HAMS)", "Frontend"]


def _exported() -> set[str]:
    return exported_names(Metrics().render()[0].decode())


def _recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def test_metric_names_are_read_from_promql():
    expr = ('histogram_quantile(0.99, sum by (app, le) (label_replace(rate('
            'a_bucket{route="predict", x=~"b|c"}[$__rate_interval]), "app", "$1", "target", '
            '"(.*)"))) / on (app) group_left b:rec:rate5m offset 5m > bool 14.4 * 0.001')
    assert metric_names(expr) == {"a_bucket", "b:rec:rate5m"}


def test_exported_names_cover_each_kind():
    text = ("# TYPE c_total counter\n# TYPE h histogram\n# TYPE s summary\n# TYPE g gauge\n"
            "# HELP g a gauge\ng 1.0\n")
    assert exported_names(text) == {"c_total", "c_created", "h_bucket", "h_sum", "h_count",
                                    "h_created", "s", "s_sum", "s_count", "s_created", "g"}


def test_dashboard_is_an_importable_grafana_dashboard():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "parityserve" and dashboard["id"] is None  # import makes one
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ROWS
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), panel["title"]


@pytest.mark.parametrize(("title", "expr"), dashboard_exprs())
def test_every_dashboard_expression_reads_only_exported_or_recorded_series(title, expr):
    names = metric_names(expr)
    assert names, f"{title}: no metric read from {expr!r}"
    unknown = names - _exported() - _recorded()
    assert not unknown, f"{title}: {sorted(unknown)} is not exported by parityserve"


def test_every_rule_reads_only_exported_or_recorded_series():
    for rule in rules():
        unknown = metric_names(rule["expr"]) - _exported() - _recorded()
        assert not unknown, f"{rule.get('record') or rule['alert']}: {sorted(unknown)}"


def test_promtool_passes_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: run scripts/prometheus.sh ensure (Debian's "
                    "prometheus package)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
