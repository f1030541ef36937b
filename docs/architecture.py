"""Draw docs/architecture.png: the package layers of ltc_async and one training step.

    .venv/bin/python docs/architecture.py            # fails if the tree and the picture disagree
    .venv/bin/python docs/architecture.py --no-strict  # only warns (while folders are being moved)

Every package folder is a box; a box imports only boxes below it.  Solid numbered
arrows follow one step; dashed arrows are events (base/events.py) reaching diagnostics.
Needs matplotlib (the `bench` extra).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W, H, KEY_H = 11.0, 9.6, 1.2  # inches: the diagram above y=0, the key of the steps below it

# ---- layout data (inches) ---------------------------------------------------------
# folder: (x0, y0, x1, y1, colour, title, contents); "user" is the user's code, not a folder
BOXES = {
    "user": (1.1, 8.6, 6.6, 9.2, "white", "user training loop",
             "loss.backward(); opt.step(); ltc.mark_step(); loss.item()"),
    "ltc_async": (2.6, 7.7, 10.85, 8.3, "#d9e8fb", "ltc_async/  (user-facing modules)",
                  "api · aio (trio twins) · debug · metrics · parallel · data"),
    "ltc_async/diagnostics": (4.65, 6.85, 10.85, 7.45, "#fbe3d6", "diagnostics/  (event subscribers)",
                              "findings · recompiles · sync_guard · timeline · location"),
    "ltc_async/tensor": (1.1, 5.3, 4.3, 6.6, "#dcf1dc", "tensor/  (the per-op path)",
                         "lazy_tensor · dispatch · trace\nshapes · special · decompositions\n"
                         "strided · host · writeback"),
    "ltc_async/patches": (4.6, 5.3, 7.15, 6.6, "#dcf1dc", "patches/  (torch, at import)",
                          "registration · inplace · seam\ncollectives · autocast · modules\n"
                          "storage · fast_paths"),
    "ltc_async/patches/native": (5.35, 5.37, 6.4, 5.65, "#c4e6c4", "native/ C++ hooks", ""),
    "ltc_async/compile": (7.35, 5.3, 9.5, 6.6, "#dcf1dc", "compile/",
                          'torch.compile(backend="ltc")\ncapture · split · vectorize\n'
                          "subgraph · fakeify"),
    "ltc_async/executor": (1.7, 4.0, 9.5, 5.0, "#fff1c7", "executor/",
                           "arena (the set of devices) · device (per-device queue, locker, worker) · futures\n"
                           "compiler (post-order, key, cache, compile on the compiler thread) · generic (shape-generic)\n"
                           "tiers (hot graphs rebuilt by the top tier in the background, swapped in when ready)\n"
                           "graph_executor (cut, schedule, read) · steps (operations as generators of futures)"),
    "devices/torchscript": (5.0, 3.0, 7.15, 3.65, "#eadcf5", "devices/torchscript/",
                            "IR → TorchScript graph, CPU/CUDA"),
    "devices/reference": (7.35, 3.0, 9.5, 3.65, "#eadcf5", "devices/reference/", "the IR interpreter"),
    "devices/inductor": (2.2, 3.0, 4.8, 3.65, "#eadcf5", "devices/inductor/",
                         "top tier: IR → FX → Inductor\n(built in the background)"),
    "ltc_async/backend": (1.7, 2.25, 9.5, 2.7, "#e4e4e4", "backend/  the seam:",
                          "abstract Backend / Computation classes (plug-ins see only this and the IR)"),
    "ltc_async/ir": (1.1, 1.15, 9.5, 1.95, "#dde3ee", "ir/",
                     "node (IR nodes, hashing) · schema (aten schemas) · lint · device_checks\n"
                     "interpreter (reference semantics of the IR)"),
    "ltc_async/base": (1.1, 0.25, 10.85, 0.85, "#ececec", "base/  (foundations)",
                       "config · counters (hot-path metrics) · events (bus: the core publishes, diagnostics "
                       "subscribe) · callsite (user call-site) · errors"),
}
INLINE = {"ltc_async/backend", "ltc_async/patches/native"}  # title and contents on one line
LAYERS = [("7 API", ["ltc_async"]), ("6 diagnostics", ["ltc_async/diagnostics"]),
          ("5 per-op path", ["ltc_async/tensor"]), ("4 executor", ["ltc_async/executor"]),
          ("3 backend\n+ plug-ins", ["ltc_async/backend", "devices/torchscript"]),
          ("2 IR", ["ltc_async/ir"]), ("1 foundations", ["ltc_async/base"])]

# one training step: (step, from box, to box, x of the vertical arrow, badge side, badge position 0..1)
STEPS = [
    (1, "user", "ltc_async/tensor", 1.55, -1, 0.5), (1, "ltc_async/tensor", "ltc_async/ir", 1.38, 1, 0.5),
    (2, "user", "ltc_async", 3.6, 1, 0.5), (2, "ltc_async", "ltc_async/executor", 4.45, -1, 0.17),
    (3, "ltc_async/executor", "ltc_async/backend", 1.95, 1, 0.5),
    (3, "ltc_async/backend", "devices/torchscript", 6.0, -1, 0.5),
    (4, "ltc_async/executor", "devices/torchscript", 6.6, 1, 0.5),
    (5, "user", "ltc_async/tensor", 2.3, 1, 0.5), (5, "ltc_async/tensor", "ltc_async/executor", 2.9, 1, 0.5),
]
STEP_TEXT = [
    "user code calls aten ops on ltc tensors → tensor/dispatch → tensor/trace + shapes build ir nodes",
    "ltc.mark_step() (api) → executor/graph_executor cuts the graph under device locks, gives tensors placeholders",
    "executor/compiler, on the compiler thread: post-order, key, cache lookup or compile through the "
    "backend seam → devices/torchscript",
    "executor/device worker executes the program and fills the futures",
    "t.cpu() / .item() waits for exactly the futures it needs",
]
BUS_X = 10.35  # event bus: publishers → base/events → diagnostics
PUBLISHERS = ["ltc_async/compile", "ltc_async/executor"]
STEP_COLOUR, EVENT_COLOUR = "#c0392b", "#7f8c8d"


# ---- consistency check: the picture must match the tree ---------------------------
def check_tree(strict):
    drawn = set(BOXES) - {"user"}
    problems = [f"drawn but missing: {d}/" for d in sorted(drawn) if not os.path.isdir(os.path.join(ROOT, d))]
    for parent in sorted(drawn | {"devices"}):  # every subfolder of a drawn folder is drawn too
        full = os.path.join(ROOT, parent)
        for name in sorted(os.listdir(full)) if os.path.isdir(full) else []:
            rel = f"{parent}/{name}"
            if name != "__pycache__" and os.path.isdir(os.path.join(full, name)) and rel not in drawn:
                problems.append(f"exists but not drawn: {rel}/")
    for p in problems:
        print(("error: " if strict else "warning: ") + p, file=sys.stderr)
    if problems and strict:
        sys.exit(f"{len(problems)} mismatch(es) between docs/architecture.py and the package tree; "
                 "update BOXES (or pass --no-strict while the tree is being moved)")


# ---- drawing ----------------------------------------------------------------------
def box(ax, key, x0, y0, x1, y1, colour, title, body):
    ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.06",
                                fc=colour, ec="#555555", lw=0.9, ls="--" if key == "user" else "-", zorder=1))
    if key in INLINE:
        ax.text(x0 + 0.08, (y0 + y1) / 2, title, ha="left", va="center", fontsize=9.5 if body else 8,
                weight="bold", zorder=3)
        if body:
            ax.text(x0 + 1.75, (y0 + y1) / 2, body, ha="left", va="center", fontsize=9, zorder=3)
        return
    ax.text(x0 + 0.08, y1 - 0.07, title, ha="left", va="top", fontsize=10, weight="bold", zorder=3)
    ax.text(x0 + 0.08, y1 - 0.3, body, ha="left", va="top", fontsize=8.8, linespacing=1.35, zorder=3,
            family="monospace" if key == "user" else None)


def arrow(ax, a, b, colour, dashed=False, lw=1.8):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=13, color=colour, lw=lw,
                                 linestyle=(0, (4, 3)) if dashed else "-", shrinkA=0, shrinkB=1, zorder=4))


def badge(ax, x, y, n, size=0.11):
    ax.add_patch(plt.Circle((x, y), size, fc=STEP_COLOUR, ec="white", lw=1, zorder=5))
    ax.text(x, y - 0.005, str(n), ha="center", va="center", color="white", fontsize=8, weight="bold", zorder=6)


def draw(out):
    fig = plt.figure(figsize=(W, H + KEY_H))
    ax = fig.add_axes([0, 0, 1, 1], xlim=(0, W), ylim=(-KEY_H, H))
    ax.axis("off")
    ax.text(0.1, H - 0.22, "ltc_async: package layers (imports only run downward) and one training step",
            fontsize=12.5, weight="bold", va="center")
    for name, keys in LAYERS:  # grey bands behind each layer, named in the left column
        y0, y1 = min(BOXES[k][1] for k in keys), max(BOXES[k][3] for k in keys)
        ax.add_patch(FancyBboxPatch((0.05, y0 - 0.07), W - 0.1, y1 - y0 + 0.14, boxstyle="square,pad=0",
                                    fc="#f5f5f5", ec="none", zorder=0))
        ax.text(0.12, (y0 + y1) / 2, name, fontsize=9, color="#444444", va="center", style="italic")
    for key, spec in BOXES.items():
        box(ax, key, *spec)
    for n, src, dst, x, side, at in STEPS:
        (_, sy0, _, sy1), (_, dy0, _, dy1) = BOXES[src][:4], BOXES[dst][:4]
        a, b = ((x, sy0), (x, dy1)) if sy0 > dy1 else ((x, sy1), (x, dy0))
        arrow(ax, a, b, STEP_COLOUR)
        badge(ax, x + side * 0.14, a[1] + at * (b[1] - a[1]), n)
    for key in PUBLISHERS:  # dashed: events published into base/events.py reach the diagnostics
        x1, y = BOXES[key][2], (BOXES[key][1] + BOXES[key][3]) / 2
        arrow(ax, (x1, y), (BUS_X, y), EVENT_COLOUR, dashed=True, lw=1.3)
    arrow(ax, (BUS_X, BOXES["ltc_async/base"][3]), (BUS_X, BOXES["ltc_async/diagnostics"][1]),
          EVENT_COLOUR, dashed=True, lw=1.3)
    ax.text(BUS_X + 0.12, 3.7, "events (base/events.py) → subscribers", rotation=90, fontsize=8.5,
            color="#555555", ha="left", va="center")
    for i, text in enumerate(STEP_TEXT, 1):  # the key of the numbered steps, under the diagram
        y = -0.05 - (i - 1) * 0.19
        badge(ax, 1.2, y, i, size=0.08)
        ax.text(1.38, y, text, fontsize=8.8, va="center")
    arrow(ax, (1.1, y - 0.19), (1.32, y - 0.19), EVENT_COLOUR, dashed=True, lw=1.3)
    ax.text(1.38, y - 0.19, "events published along the way (base/events.py) reach the diagnostics subscribers",
            fontsize=8.8, va="center")
    fig.savefig(out, dpi=150, facecolor="white")
    print(f"wrote {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                    help="fail (default) or only warn when the drawn folders and the tree disagree")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "architecture.png"))
    args = ap.parse_args()
    check_tree(args.strict)
    draw(args.out)
