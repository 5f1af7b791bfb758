#!/usr/bin/env python3
"""Checks scripts/grafana-dashboard.json: valid JSON, every panel has a query, and every ddp_* name
in a query is a series that ddp_launch serves (the names in launcher/observe/progress_board.cpp).

    check_grafana_dashboard.py DASHBOARD.json launcher/observe/progress_board.cpp
"""
import json
import re
import sys


def main(dashboard_path, renderer_path):
    with open(dashboard_path) as f:
        dashboard = json.load(f)  # raises on invalid JSON
    with open(renderer_path) as f:
        served = set(re.findall(r'"(ddp_[a-z0-9_]+)"', f.read()))
    if not served:
        return f"no ddp_* series names found in {renderer_path}"
    problems = []
    exprs = []
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            exprs.append((f"variable {variable['name']}", variable["query"]))
    ids = set()
    for panel in dashboard.get("panels", []):
        title = panel.get("title") or f"panel {panel.get('id')}"
        if panel.get("id") in ids:
            problems.append(f"{title}: duplicate panel id {panel.get('id')}")
        ids.add(panel.get("id"))
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"{title}: no query")
        exprs += [(title, t.get("expr", "")) for t in targets]
    for where, expr in exprs:
        names = re.findall(r"\bddp_[a-z0-9_]+", expr)
        if not names:
            problems.append(f"{where}: query '{expr}' names no ddp_* series")
        problems += [f"{where}: '{n}' is not a series ddp_launch serves" for n in names if n not in served]
    if problems:
        return "\n".join(problems)
    print(f"{dashboard_path}: {len(dashboard['panels'])} panels, {len(exprs)} queries, "
          f"all over the {len(served)} series ddp_launch serves")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
