"""Render the architecture picture of docs/architecture.md with matplotlib (no network, no graphviz).

Usage::

    python3 docs/diagrams.py                 # writes docs/architecture.png
    python3 docs/diagrams.py --out /tmp/a.png

Coordinates are in tenths of an inch (the canvas is 15 x 11.1 inches), so a
font of 10 pt is about 1.4 units tall.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display here, and none needed

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

WIDTH, HEIGHT = 150, 111  # canvas units (0.1 inch each)
DPI = 110

# one colour per kind of path; the legend at the bottom names them
CONTROL = "#1f5fbf"  # gRPC control plane (dashed)
DATA = "#e07b00"  # framed binary TCP data plane
SHORT = "#8e3fb5"  # same-host short circuit
BABEL = "#2e8b3e"  # Babel transfers

FILL = {
    "store": "#eef5ee",
    "babel": "#e3f2e3",
    "master": "#e6eefb",
    "node": "#fafafa",
    "app": "#fff7e0",
    "client": "#fdeee0",
    "worker": "#f3e9f9",
    "tier": "#ffffff",
    "planned": "#f2f2f2",
}


def box(ax, x, y, w, h, title, lines=(), *, fill="#ffffff", edge="#333333", size=11, style="-", title_size=None):
    """A rounded box with a bold title line and plain lines under it, centred."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0,rounding_size=1.2",
            facecolor=fill,
            edgecolor=edge,
            linewidth=1.3,
            linestyle=style,
            zorder=1,
        )  # fmt: skip
    )
    text = [title, *lines]
    step = size * 0.155  # line pitch in canvas units
    top = y + h / 2 + step * (len(text) - 1) / 2
    for i, line in enumerate(text):
        ax.text(
            x + w / 2, top - i * step, line, ha="center", va="center", zorder=3,
            fontsize=(title_size or size) if i == 0 else size - 0.5,
            fontweight="bold" if i == 0 else "normal",
        )  # fmt: skip


def arrow(ax, start, end, color, *, dashed=False, both=False, width=1.8, label=None, at=None, ha="left", size=9.5):
    """A straight arrow from ``start`` to ``end``; ``label`` is written at ``at`` (canvas units)."""
    ax.annotate(
        "", xy=end, xytext=start, zorder=2,
        arrowprops={
            "arrowstyle": "<|-|>" if both else "-|>", "color": color, "lw": width,
            "linestyle": (0, (5, 3)) if dashed else "-", "shrinkA": 0, "shrinkB": 0, "mutation_scale": 16,
        },
    )  # fmt: skip
    if label:
        ax.text(*at, label, color=color, fontsize=size, ha=ha, va="center", zorder=3, linespacing=1.25)


def node(ax, x0, index):
    """One compute node: trainer ranks, FUSE mount, checkpoint SDK, PCache worker."""
    box(ax, x0, 6, 56, 48, "", fill=FILL["node"], edge="#777777")
    ax.text(x0 + 1.5, 52, f"compute node {index}", fontsize=12, fontweight="bold", va="center", zorder=3)
    box(ax, x0 + 9, 41.5, 40, 7.5, "trainer ranks", ["torchrun, one per GPU"], fill=FILL["app"])
    box(ax, x0 + 2, 26.5, 24, 9.5, "FUSE mount", ["pcache-mount", "/mnt/pcache"], fill=FILL["client"])
    box(ax, x0 + 28, 26.5, 21, 9.5, "checkpoint SDK", ["ckpt_adapter", "shm staging"], fill=FILL["client"])
    ax.text(x0 + 27, 23.8, "both on\npcache.client", fontsize=9.5, ha="center", va="center", color="#555555",
            zorder=3, linespacing=1.1)  # fmt: skip
    box(ax, x0 + 2, 8, 52, 13.5, "", fill=FILL["worker"], edge="#6a2c8c")
    ax.text(x0 + 28, 19.6, "PCache worker", fontsize=11.5, fontweight="bold", ha="center", va="center", zorder=3)
    box(ax, x0 + 4, 9.5, 22, 7.8, "memory tier", ["hot 1 MiB chunks"], fill=FILL["tier"])
    box(ax, x0 + 29, 9.5, 23, 7.8, "NVMe block files", ["CRC32C per chunk"], fill=FILL["tier"])
    # the application reaches PCache through the mount (datasets) or the SDK (checkpoints)
    arrow(ax, (x0 + 14, 41.5), (x0 + 14, 36), "#444444", width=1.4, label="read shards", at=(x0 + 15, 38.8))
    arrow(ax, (x0 + 38.5, 41.5), (x0 + 38.5, 36), "#444444", width=1.4, label="dcp.save / load", at=(x0 + 39.5, 38.8))
    # same-host short circuit: block files' descriptors over the worker's UNIX socket
    arrow(ax, (x0 + 14, 26.5), (x0 + 14, 21.5), SHORT, both=True, width=2.6)
    arrow(ax, (x0 + 38.5, 26.5), (x0 + 38.5, 21.5), SHORT, both=True, width=2.6)
    # control plane to the master: the client's metadata RPCs and the worker's heartbeats
    arrow(ax, (x0 + 4.5, 36), (x0 + 4.5, 62), CONTROL, dashed=True, width=1.7)
    arrow(ax, (x0 + 52, 21.5), (x0 + 52, 62), CONTROL, dashed=True, width=1.7)


def render(out: Path) -> Path:
    """Draw the picture into ``out`` (PNG); returns the path."""
    fig = plt.figure(figsize=(WIDTH / 10, HEIGHT / 10), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(0, HEIGHT)
    ax.axis("off")

    # ---- regions and Babel (top row)
    box(ax, 2, 91, 34, 17, "Region A", ["object store", "(S3 / OSS bucket)"], fill=FILL["store"], edge=BABEL,
        size=11.5)  # fmt: skip
    box(ax, 114, 91, 34, 17, "Region B", ["object store", "(S3 / OSS bucket)"], fill=FILL["store"], edge=BABEL,
        size=11.5)  # fmt: skip
    box(
        ax, 45, 88, 60, 21, "Babel: babel sync / babel daemon",
        ["parallel lister → planner → transfer → verify", "in-stream CRC32C, sampled or full check",
         "RocksDB job journal: resume after kill -9"],
        fill=FILL["babel"], edge=BABEL, title_size=12,
    )  # fmt: skip
    arrow(ax, (36, 99.5), (45, 99.5), BABEL, both=True, width=2.6)
    arrow(ax, (105, 99.5), (114, 99.5), BABEL, both=True, width=2.6)
    ax.text(40.5, 102.3, "s3://", color=BABEL, fontsize=10, ha="center")
    ax.text(109.5, 102.3, "s3://", color=BABEL, fontsize=10, ha="center")
    arrow(ax, (75, 88), (75, 81), BABEL, both=True, width=2.6)
    ax.text(76.5, 84.5, "pcache://MASTER/path  (via pcache.client)", color=BABEL, fontsize=10.5, va="center")

    # ---- the PCache cluster frame
    box(ax, 1, 4.5, 148, 76.5, "", fill="#ffffff", edge="#999999", style="--")
    ax.text(2.5, 79, "PCache cluster", fontsize=12, fontweight="bold", va="center", color="#555555")

    # ---- master (control plane)
    box(ax, 3, 62, 144, 15, "", fill=FILL["master"], edge=CONTROL)
    ax.text(75, 74.6, "PCache master  (gRPC control plane)", fontsize=12.5, fontweight="bold", ha="center",
            va="center")  # fmt: skip
    columns = [
        (27, ["namespace: inodes, dentries", "block map: file → blocks → replicas"]),
        (75, ["metastore: RocksDB (rocksdict)", "one atomic WriteBatch per mutation"]),
        (123, ["worker registry (heartbeats)", "placement, re-replication"]),
    ]
    for cx, lines in columns:
        for i, line in enumerate(lines):
            ax.text(cx, 71 - i * 1.9, line, fontsize=11, ha="center", va="center")
    ax.text(75, 64.7, "one leader, new epoch per start  ·  follower / HA (etcd lease): planned, not implemented",
            fontsize=10.5, ha="center", va="center", color="#555555", style="italic")  # fmt: skip

    # ---- compute nodes
    lefts = (3, 67)
    for i, x0 in enumerate(lefts, start=1):
        node(ax, x0, i)
    box(ax, 131, 6, 16, 48, "", fill=FILL["node"], edge="#777777", style=":")
    ax.text(139, 30, "nodes 3 … N\n(same as node 1)", fontsize=11, ha="center", va="center", rotation=90,
            color="#555555")  # fmt: skip
    ax.text(8.8, 58.4, "gRPC: Create, AllocateBlock, CommitFile …", color=CONTROL, fontsize=10, va="center")
    ax.text(53.6, 56, "Heartbeat ↔ commands", color=CONTROL, fontsize=10, va="center", ha="right")
    # replication pipeline between workers (TCP data plane)
    arrow(ax, (57, 13.5), (69, 13.5), DATA, width=2.8)
    ax.text(63, 16, "replica", color=DATA, fontsize=10, ha="center", va="center")
    arrow(ax, (121, 13.5), (131, 13.5), DATA, width=2.8, dashed=True)

    # ---- legend
    handles = [
        Line2D([], [], color=CONTROL, lw=1.8, linestyle=(0, (5, 3)), label="control: gRPC"),
        Line2D([], [], color=DATA, lw=2.8, label="data: framed TCP (remote reads, pipeline w1 → w2)"),
        Line2D([], [], color=SHORT, lw=2.8, label="same host: block fd over UNIX socket"),
        Line2D([], [], color=BABEL, lw=2.8, label="Babel transfers"),
    ]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, -0.005), ncol=4, fontsize=10.5,
              frameon=False, handlelength=2.4, columnspacing=1.4)  # fmt: skip

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, facecolor="white")
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("architecture.png"), help="PNG path")
    args = parser.parse_args(argv)
    print(render(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
