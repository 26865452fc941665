"""A minimal PNG line plot (standard library only: zlib + struct), for the examples' loss
curves where matplotlib is not installed."""

from __future__ import annotations

import struct
import zlib

COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def line_plot(path: str, curves: dict[str, list[float]], width: int = 640, height: int = 400,
              log_y: bool = True) -> None:
    """Writes the curves (name -> y values over steps) as a PNG: axes box, one colour per curve
    in insertion order (blue, red, green, purple); y on a log scale by default."""
    import math

    pad = 30
    img = [[(255, 255, 255)] * width for _ in range(height)]
    ys = [y for c in curves.values() for y in c if y > 0 or not log_y]
    f = (lambda y: math.log10(y)) if log_y else (lambda y: y)
    lo, hi = f(min(ys)), f(max(ys))
    hi = hi if hi > lo else lo + 1
    n = max(len(c) for c in curves.values())

    def put(px, py, color):
        if 0 <= px < width and 0 <= py < height:
            img[py][px] = color

    for px in range(pad, width - pad):  # axes
        put(px, height - pad, (0, 0, 0))
        put(px, pad, (200, 200, 200))
    for py in range(pad, height - pad):
        put(pad, py, (0, 0, 0))
        put(width - pad, py, (200, 200, 200))
    for k, c in enumerate(curves.values()):
        color = COLORS[k % len(COLORS)]
        prev = None
        for i, y in enumerate(c):
            if log_y and y <= 0:
                continue
            px = pad + int((width - 2 * pad) * i / max(n - 1, 1))
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
