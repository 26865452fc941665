"""Loss curves as a PNG, for the examples: with matplotlib (when installed) a plot with axes,
ticks, labels and a legend; without it a plain drawing from the standard library alone
(zlib + struct): an axes box and one colour per curve."""

from __future__ import annotations

import math
import struct
import zlib

# blue, red, green, purple, orange, brown
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14),
          (140, 86, 75)]


def _points(curve) -> list[tuple[float, float]]:
    """(x, y) pairs from a list of y values (x = 0, 1, ...) or of (x, y) pairs."""
    return [tuple(v) if isinstance(v, (list, tuple)) else (i, v) for i, v in enumerate(curve)]


def line_plot(path: str, curves: dict, width: int = 640, height: int = 400, log_y: bool = True,
              xlabel: str = "step", ylabel: str = "loss", title: str | None = None,
              colors: dict | None = None) -> None:
    """Writes the curves (name -> y values over steps, or (step, y) pairs) as a PNG of about
    width x height pixels, one colour per curve: colors[name] (an RGB triple of 0..255) where
    given, else COLORS in insertion order (blue, red, green, purple, orange, brown); y on a log
    scale by default. Labels, title and legend need matplotlib."""
    points = {name: _points(c) for name, c in curves.items()}
    colors = {name: (colors or {}).get(name, COLORS[k % len(COLORS)])
              for k, name in enumerate(points)}
    try:
        import matplotlib
    except ImportError:
        _plain_plot(path, points, colors, width, height, log_y)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(width / 100, height / 100), dpi=100)
    for name, pts in points.items():
        ax.plot([x for x, _ in pts], [y for _, y in pts], label=name,
                color=[c / 255 for c in colors[name]])
    if log_y:  # a log scale with plain numbers (2.5, not 2.5 x 10^0) at its ticks
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plain_plot(path: str, points: dict, colors: dict, width: int, height: int,
                log_y: bool) -> None:
    pad = 30
    img = [[(255, 255, 255)] * width for _ in range(height)]
    f = (lambda y: math.log10(y)) if log_y else (lambda y: y)
    kept = {n: [(x, y) for x, y in p if y > 0 or not log_y] for n, p in points.items()}
    ys = [f(y) for p in kept.values() for _, y in p]
    xs = [x for p in kept.values() for x, _ in p]
    lo, hi = min(ys), max(ys)
    hi = hi if hi > lo else lo + 1
    x0, x1 = min(xs), max(xs)
    x1 = x1 if x1 > x0 else x0 + 1

    def put(px, py, color):
        if 0 <= px < width and 0 <= py < height:
            img[py][px] = color

    for px in range(pad, width - pad):  # axes
        put(px, height - pad, (0, 0, 0))
        put(px, pad, (200, 200, 200))
    for py in range(pad, height - pad):
        put(pad, py, (0, 0, 0))
        put(width - pad, py, (200, 200, 200))
    for name, p in kept.items():
        color = colors[name]
        prev = None
        for x, y in p:
            px = pad + int((width - 2 * pad) * (x - x0) / (x1 - x0))
            py = height - pad - int((height - 2 * pad) * (f(y) - lo) / (hi - lo))
            if prev:  # a straight segment from the previous point
                steps = max(abs(px - prev[0]), abs(py - prev[1]), 1)
                for s in range(steps + 1):
                    put(prev[0] + (px - prev[0]) * s // steps, prev[1] + (py - prev[1]) * s // steps, color)
            prev = (px, py)
    raw = b"".join(b"\0" + bytes(v for p in row for v in p) for row in img)

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    with open(path, "wb") as out:
        out.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                  + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
