"""Plots scripts/bench-hooks.sh's CSV: samples/s against link rate, one line per hook (C++ solid,
PyTorch dashed), one panel per model and host count. A small SVG writer (the venv has no matplotlib).
Also prints the Markdown tables of docs/benchmarks.md "Slow links" (busbw; samples/s, scaling against
one host, C++ / PyTorch). With several rounds (bench-hooks.sh ROUNDS, or runs into one OUT_DIR) every
figure is the median over the rounds, with [min-max] after it; a scaling divides a round's value by
that round's one-host baseline and a C++/PyTorch ratio pairs the two runs of one round, so both are
medians of per-round ratios. A CSV without the round column is one round.

  .venv/bin/python scripts/plot_hooks.py OUT_DIR/hooks.csv docs/slow-links.svg
"""
import csv
import math
import statistics
import sys

COLOURS = {"allreduce": "#1f77b4", "fp16": "#ff7f0e", "bf16": "#8c564b", "powersgd:1": "#2ca02c",
           "powersgd:2": "#d62728", "powersgd:4": "#9467bd", "ceiling": "#000"}
RATE_MBPS = {"10mbit": 10, "100mbit": 100, "1gbit": 1000, "10gbit": 10000}
PANEL_W, PANEL_H, MARGIN = 420, 300, 60


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "failed", or nothing measured


def read_rows(path):
    """The CSV's rows, each with its round (1 where the column is missing: an older, one-round CSV)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row["round"] = row.get("round") or "1"
    return rows


def load(path):
    """(model, hosts) -> (hook, impl) -> rate in Mb/s -> the median samples/s over the rounds."""
    values = {}
    for row in read_rows(path):
        value = number(row["value"])
        if row["kind"] != "samples_per_s" or row["rate"] not in RATE_MBPS or row["hosts"] == "1" or value is None:
            continue
        values.setdefault((row["model"], int(row["hosts"])), {}).setdefault((row["hook"], row["impl"]), {}).setdefault(
            RATE_MBPS[row["rate"]], []).append(value)
    return {panel_key: {series: {rate: statistics.median(v) for rate, v in points.items()}
                        for series, points in by_series.items()} for panel_key, by_series in values.items()}


def panel(out, x0, y0, title, series):
    rates = sorted({r for points in series.values() for r in points})
    values = [v for points in series.values() for v in points.values() if v > 0]
    if not rates or not values:
        return
    low, high = math.log10(min(values) / 1.5), math.log10(max(values) * 1.5)
    x_of = lambda r: x0 + MARGIN + (0.5 if len(rates) == 1 else rates.index(r) / (len(rates) - 1)) * (PANEL_W - 2 * MARGIN)
    y_of = lambda v: y0 + PANEL_H - MARGIN + (PANEL_H - 1.6 * MARGIN) * -(math.log10(v) - low) / (high - low)
    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{y0 + 20}" text-anchor="middle" font-weight="bold">{title}</text>')
    out.append(f'<line x1="{x0 + MARGIN}" y1="{y0 + PANEL_H - MARGIN}" x2="{x0 + PANEL_W - MARGIN / 2}" '
               f'y2="{y0 + PANEL_H - MARGIN}" stroke="black"/>')
    out.append(f'<line x1="{x0 + MARGIN}" y1="{y0 + MARGIN / 2}" x2="{x0 + MARGIN}" y2="{y0 + PANEL_H - MARGIN}" stroke="black"/>')
    for r in rates:
        label = f"{r // 1000} Gb/s" if r >= 1000 else f"{r} Mb/s"
        out.append(f'<text x="{x_of(r)}" y="{y0 + PANEL_H - MARGIN + 18}" text-anchor="middle">{label}</text>')
    for e in range(math.floor(low), math.ceil(high) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if low <= math.log10(v) <= high:
                out.append(f'<text x="{x0 + MARGIN - 6}" y="{y_of(v) + 4}" text-anchor="end">{v:g}</text>')
    out.append(f'<text x="{x0 + 14}" y="{y0 + PANEL_H / 2}" transform="rotate(-90 {x0 + 14} {y0 + PANEL_H / 2})" '
               f'text-anchor="middle">samples/s (log)</text>')
    for (hook, impl), points in sorted(series.items()):
        pts = [(x_of(r), y_of(v)) for r, v in sorted(points.items()) if v > 0]
        dash = "" if impl == "cpp" else ' stroke-dasharray="6 4"'
        colour = COLOURS.get(hook, "#444")
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        for x, y in pts:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>')


def summary(values, fmt):
    """The median of VALUES, and [min-max] when there are several."""
    text = fmt(statistics.median(values))
    return text if len(values) == 1 else f"{text} [{fmt(min(values))}-{fmt(max(values))}]"


def tables(path):
    busbw, speed, single = {}, {}, {}  # key -> (busbw: impl ->) round -> value
    rows = read_rows(path)
    for row in rows:
        value, rnd = number(row["value"]), row["round"]
        if value is None:
            continue
        if row["kind"] == "busbw_Mbps":
            busbw.setdefault((row["rate"], row["hosts"], row["model"]), {}).setdefault(row["impl"], {})[rnd] = value
        elif row["hosts"] == "1":
            single.setdefault((row["model"], row["rate"]), {})[rnd] = value
        else:
            speed.setdefault((row["model"], row["hosts"], row["rate"]), {}).setdefault((row["hook"], row["impl"]), {})[
                rnd] = value
    print(f"rounds: {len({row['round'] for row in rows})}; figures are medians over the rounds, [min-max] after them\n")
    # busbw: C++ as the library chooses (cpp: sliced across hosts), C++ unsliced and PyTorch's
    # dist.all_reduce where the CSV has them (older CSVs: cpp only).
    impls = [impl for impl in ("cpp", "cpp-unsliced", "torch") if any(impl in cells for cells in busbw.values())]
    names = {"cpp": "C++ all-reduce busbw", "cpp-unsliced": "C++ unsliced", "torch": "PyTorch dist.all_reduce"}
    print("| link | hosts | size | " + " | ".join(names[i] for i in impls) + " |\n|---|---|---|" + "---|" * len(impls))
    for (rate, hosts, size), by_impl in busbw.items():
        cells = []
        for impl in impls:
            values = list(by_impl.get(impl, {}).values())
            if not values:
                cells.append("-")
                continue
            share = summary([v / RATE_MBPS[rate] for v in values], lambda x: f"{x:.0%}") if rate in RATE_MBPS else "-"
            cells.append(f"{summary(values, lambda x: f'{x:.1f}')} Mb/s ({share})")
        print(f"| {rate} | {hosts} | {size.replace('-', '8MiB')} | " + " | ".join(cells) + " |")
    print()
    hooks = []
    for cells in speed.values():
        for hook, _ in cells:
            if hook not in hooks:
                hooks.append(hook)
    print("| model | hosts | link | " + " | ".join(hooks) + " |")
    print("|---|---|---|" + "---|" * len(hooks))
    for (model, hosts, rate), cells in sorted(speed.items(), key=lambda kv: (kv[0][0], int(kv[0][1]), -RATE_MBPS.get(kv[0][2], 0))):
        one = single.get((model, rate)) or single.get((model, "none"), {})
        out = []
        for hook in hooks:
            cpp, torch = cells.get((hook, "cpp"), {}), cells.get((hook, "torch"), {})
            if not cpp:
                out.append("-")
                continue
            text = summary(list(cpp.values()), lambda x: f"{x:.1f}")
            scaling = [v / one[r] for r, v in cpp.items() if one.get(r)]
            if scaling:
                text += f" ({summary(scaling, lambda x: f'{x:.2f}')}x one host)"
            ceiling = cells.get(("ceiling", "cpp"), {})  # the same hosts with no communication, per round
            of_ceiling = [v / ceiling[r] for r, v in cpp.items() if ceiling.get(r)]
            if hook != "ceiling" and of_ceiling:
                text += f" {summary(of_ceiling, lambda x: f'{x:.0%}')} of the ceiling"
            paired = [v / torch[r] for r, v in cpp.items() if torch.get(r)]
            if torch:
                text += f"; PyTorch {summary(list(torch.values()), lambda x: f'{x:.1f}')}"
            if paired:
                text += f", C++/PyTorch {summary(paired, lambda x: f'{x:.2f}')}"
            out.append(text)
        print(f"| {model} | {hosts} | {rate} | " + " | ".join(out) + " |")
    print("\none host (ddp_bench --mode single): " + ", ".join(
        f"{m} {summary(list(v.values()), lambda x: f'{x:.1f}')} samples/s ({r})" for (m, r), v in single.items()))


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    rows = load(sys.argv[1])
    panels = sorted(k for k in rows if k[1] > 1)
    width = PANEL_W * max(1, len(panels)) + 180
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H + 20}" '
           f'font-family="sans-serif" font-size="12">', f'<rect width="{width}" height="{PANEL_H + 20}" fill="white"/>']
    for i, (model, hosts) in enumerate(panels):
        panel(out, i * PANEL_W, 0, f"{model}, {hosts} hosts", rows[(model, hosts)])
    legend_x = PANEL_W * max(1, len(panels)) + 10
    hooks = sorted({h for k in panels for (h, _) in rows[k]})
    for j, hook in enumerate(hooks):
        y = 40 + 20 * j
        out.append(f'<line x1="{legend_x}" y1="{y}" x2="{legend_x + 24}" y2="{y}" stroke="{COLOURS.get(hook, "#444")}" stroke-width="2"/>')
        out.append(f'<text x="{legend_x + 30}" y="{y + 4}">{hook}</text>')
    y = 40 + 20 * len(hooks) + 10
    out.append(f'<text x="{legend_x}" y="{y}">solid: C++ DDP</text>')
    out.append(f'<text x="{legend_x}" y="{y + 16}">dashed: PyTorch DDP</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")
    tables(sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
