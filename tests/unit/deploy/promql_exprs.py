"""The PromQL of deploy/grafana/parityserve.json and deploy/prometheus/rules.yml, and the
metric names an expression reads: shared by the dashboard's unit test and the test that
evaluates every expression against a real Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "parityserve.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"

# Grafana's own variables, with what they stand for when an expression is run by hand.
GRAFANA_VARIABLES = {"$__rate_interval": "1m"}

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
             "unless", "bool", "offset", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])\s*(\()?")


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) for every query of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


def runnable(expr: str) -> str:
    """The expression with Grafana's variables replaced, as Prometheus takes it."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names an expression reads: identifiers that are not
    functions, keywords, label names or durations."""
    bare = _STRING.sub('""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # ranges
    bare = _GROUPING.sub("", bare)
    names = set()
    for match in _NAME.finditer(bare):
        name, call = match.group(1), match.group(2)
        if call is None and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def exported_names(exposition: str) -> set[str]:
    """Every sample name a /metrics text can hold, from its TYPE lines: a family with no
    sample yet (a labelled counter before its first count) is still declared there."""
    names = set()
    for line in exposition.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[:2] != ["#", "TYPE"]:
            continue
        name, kind = parts[2], parts[3]
        if kind == "counter":
            base = name.removesuffix("_total")
            names |= {base + "_total", base + "_created"}
        elif kind in ("histogram", "summary"):
            names |= {name + "_count", name + "_sum", name + "_created"}
            names |= {name + "_bucket"} if kind == "histogram" else {name}
        else:
            names.add(name)
    return names
