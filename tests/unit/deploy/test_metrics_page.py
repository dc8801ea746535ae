"""docs/metrics.md lists every metric parityserve exports, as exported, and every rule.

The page's metric table must name exactly the families a server's registry declares (a new
metric without a row, or a row for a metric gone, fails), each with its type, its labels and
its HELP text; its alert table must name exactly the alerts of deploy/prometheus/rules.yml, and
every recorded series must be on the page.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from parityserve.runtime.modelpath.metrics import Metrics
from tests.unit.deploy.promql_exprs import rules

PAGE = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
_ROW = re.compile(r"^\| `(parityserve_\w+)` \| (\w+) \| ([\w,]*) \| (.*) \|$", re.M)
_ALERT = re.compile(r"^\| `(Parityserve\w+)`", re.M)
_SUFFIX = {"counter": "_total"}


def registry_families(metrics: Metrics) -> dict[str, tuple[str, str, str]]:
    """name -> (type, labels joined by commas, help) of every family ``metrics`` declares.

    The names are the ones /metrics shows (a counter's with ``_total``). Label names are not
    in the exposition until a series exists, so they are read from each collector (a
    prometheus_client metric or a MetricFamily a custom collector yields).
    """
    families: dict[str, tuple[str, str, str]] = {}
    collectors: list[Any] = list(metrics.registry._collector_to_names)  # noqa: SLF001
    for collector in collectors:
        described = list(collector.describe()) if hasattr(collector, "describe") \
            else list(collector.collect())
        labels = getattr(collector, "_labelnames", None)
        for family in described:
            names = labels if labels is not None else getattr(family, "_labelnames", ())
            name = family.name + _SUFFIX.get(family.type, "")
            families[name] = (family.type, ",".join(names), family.documentation)
    return families


def page_rows(text: str) -> dict[str, tuple[str, str, str]]:
    return {m.group(1): (m.group(2), m.group(3), m.group(4)) for m in _ROW.finditer(text)}


def test_the_registry_reader_sees_counters_histograms_and_collected_families() -> None:
    families = registry_families(Metrics())
    assert families["parityserve_requests_total"] == (
        "counter", "route,target,outcome", "HTTP requests answered")
    assert families["parityserve_queue_time_seconds"][:2] == ("histogram", "model")
    assert families["parityserve_graph_failover_phase_seconds"][:2] == (
        "summary", "graph,operator,phase")
    assert families["parityserve_event_loop_busy"][:2] == ("gauge", "")


def test_every_exported_metric_is_on_the_page_as_exported() -> None:
    exported = registry_families(Metrics())
    listed = page_rows(PAGE.read_text())
    assert sorted(set(exported) - set(listed)) == [], "exported but not on docs/metrics.md"
    assert sorted(set(listed) - set(exported)) == [], "on docs/metrics.md but not exported"
    differ = {name: (listed[name], exported[name]) for name in exported
              if listed[name] != exported[name]}
    assert differ == {}, "docs/metrics.md row (type, labels, help) against the registry's"


def test_every_alert_and_recorded_series_is_on_the_page() -> None:
    text = PAGE.read_text()
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert set(_ALERT.findall(text)) == alerts
    for record in (r["record"] for r in rules() if "record" in r):
        # a family of windows shares one row: `name:rate5m` .. `:rate3d`, windows listed
        if f"`{record}`" in text:
            continue
        prefix, _, window = record.rpartition(":rate")
        row = next((line for line in text.splitlines() if prefix and f"`{prefix}:rate" in line),
                   "")
        assert re.search(rf"\b{window}\b", row), f"{record} is not on docs/metrics.md"
