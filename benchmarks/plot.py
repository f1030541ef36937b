"""Plot bench_lazy's results table as a PNG (one panel per case, a bar per engine).

    python -m benchmarks.plot                      # the table in benchmarks/README.md
    python -m benchmarks.plot --from results.md -o out.png
    python -m benchmarks.bench_lazy --plot out.png # straight after a run

Each panel shows one case (`trace`, `mlp`, `big`, `overlap`) in its own unit: the bar is the
median over rounds, the whisker the min..max range, the label the ratio to eager.  Needs
matplotlib, the `bench` extra: `pip install -e ".[bench]"`.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TABLE = os.path.join(HERE, "README.md")
DEFAULT_PNG = os.path.join(HERE, "bench_lazy.png")
_COLORS = {"eager": "#7f7f7f", "torch._lazy": "#1f77b4", "ltc_async": "#d62728",
           "torch.compile": "#2ca02c"}


class Row(NamedTuple):
    case: str
    engine: str
    median: float
    unit: str            # "us/op", "ms/step", "steps/s"
    higher_is_better: bool
    low: float
    high: float


def rows_from_markdown(text: str) -> list[Row]:
    """The rows of the first `| case | engine | median | unit | min..max | ...` table in
    `text` (rows whose median is `n/a` are left out)."""
    rows: list[Row] = []
    in_table = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:4] == ["case", "engine", "median", "unit"]:
            if rows:
                break
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            if rows:
                break
            continue
        if set(cells[0]) <= {"-", ":"}:
            continue
        try:
            median = float(cells[2])
            low, high = (float(v) for v in cells[4].split(".."))
        except ValueError:
            continue
        m = re.match(r"(\S+) \((higher|lower) is better\)", cells[3])
        unit, better = (m.group(1), m.group(2) == "higher") if m else (cells[3], False)
        rows.append(Row(cells[0], cells[1], median, unit, better, low, high))
    return rows


def _color(engine: str) -> str:
    for name, color in _COLORS.items():
        if engine.startswith(name):
            return color
    return "#9467bd"


def plot(rows: list[Row], path: str, title: str = "") -> str:
    """Write the figure to `path` (PNG) and return `path`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plotting needs matplotlib: pip install -e '.[bench]'") from None
    cases = list(dict.fromkeys(r.case for r in rows))
    if not cases:
        raise SystemExit("no benchmark rows to plot")
    ncols = min(3, len(cases))
    nrows = (len(cases) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(cases):]:
        ax.set_visible(False)
    for ax, case in zip(axes.flat, cases):
        mine = [r for r in rows if r.case == case]
        eager = next((r.median for r in mine if r.engine == "eager"), None)
        xs = range(len(mine))
        colors = [_color(r.engine) for r in mine]
        ax.bar(xs, [r.median for r in mine], color=colors,
               yerr=[[r.median - r.low for r in mine], [r.high - r.median for r in mine]],
               capsize=3, error_kw={"elinewidth": 0.8})
        ax.set_xticks(list(xs), [r.engine for r in mine], rotation=20, ha="right", fontsize=8)
        ax.margins(y=0.12)
        better = "higher" if mine[0].higher_is_better else "lower"
        ax.set_title(f"{case}", fontsize=10)
        ax.set_ylabel(f"{mine[0].unit} ({better} is better)", fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
        for x, r in zip(xs, mine):
            if eager:
                ax.annotate(f"{r.median / eager:.2f}x", (x, r.high), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 2), textcoords="offset points")
    fig.suptitle(title or "bench_lazy: median over rounds (whiskers: min..max; labels: vs eager)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", default=DEFAULT_TABLE,
                   help="a file holding bench_lazy's markdown table (default: benchmarks/README.md)")
    p.add_argument("-o", "--output", default=DEFAULT_PNG, help="PNG to write")
    args = p.parse_args(argv)
    with open(args.source) as f:
        rows = rows_from_markdown(f.read())
    print(plot(rows, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
