#!/usr/bin/env python3
"""Render a Chrome-trace JSON (as written by the profiler) to a PNG timeline.

The picture imitates Perfetto / chrome://tracing: one horizontal track per
thread (here: per CUDA stream), labelled with its ``thread_name`` metadata and
ordered by ``thread_sort_index``; every complete event (``"ph":"X"``) is a box
from ``ts`` to ``ts + dur``, stacked by nesting depth, coloured by its name,
with the name printed inside when the box is wide enough. Instant events
(``"ph":"i"``, the allocator's allocations and frees) are small triangles at
the top of their track (green: alloc, red: free). Counter events
(``"ph":"C"``, the memory timeline) become counter tracks below the threads,
one per counter name, drawn as step charts: the first series filled, the
others as lines. A time axis in milliseconds runs along the top. Only the standard library and Pillow are used,
so it runs where no browser can (the docs' pictures are made this way).

Run it from the repository root:

    python3 -m venv target/docs-venv
    target/docs-venv/bin/pip install pillow
    target/docs-venv/bin/python docs/tools/render_trace.py \\
        TRACE.json OUT.png [--width 1600] [--title TEXT]

docs/images/demo-timeline.png is the trace.json that the three-stream profiler
example (then ``profiler_demo`` in the profiler crate, now
``cargo run -p cuda-streams --example profiler -- FILE``) wrote on the NVIDIA
H200, rendered with
``--title "profiler_demo on GPU 0: NVIDIA H200 (CUDA driver), 3 streams"``.
"""

from __future__ import annotations

import argparse
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

# Perfetto-like slice colours (material palette, mid tones).
PALETTE = [
    (0x42, 0x85, 0xF4),
    (0x0F, 0x9D, 0x58),
    (0xF4, 0xB4, 0x00),
    (0xDB, 0x44, 0x37),
    (0xAB, 0x47, 0xBC),
    (0x00, 0xAC, 0xC1),
    (0xFF, 0x70, 0x43),
    (0x9E, 0x9D, 0x24),
    (0x5C, 0x6B, 0xC0),
    (0xF0, 0x62, 0x92),
    (0x00, 0x79, 0x6B),
    (0x8D, 0x6E, 0x63),
]

BACKGROUND = (255, 255, 255)
TEXT = (32, 33, 36)
MUTED = (95, 99, 104)
GRID = (232, 234, 237)
TRACK_RULE = (218, 220, 224)
LABEL_BG = (248, 249, 250)

LABEL_W = 190  # left column with the track names
MARGIN_R = 24
ROW_H = 24  # one nesting level
ROW_GAP = 2
TRACK_PAD = 8
MIN_TEXT_W = 28  # narrower boxes get no name
LEGEND_ROW_H = 22
LABEL_H = 50  # a track's name and slice count need this much height


@dataclass
class Slice:
    name: str
    ts: float  # microseconds
    dur: float
    depth: int


@dataclass
class Track:
    pid: int
    tid: int
    name: str
    sort_index: int
    slices: list[Slice] = field(default_factory=list)
    instants: list[tuple[float, str]] = field(default_factory=list)

    @property
    def levels(self) -> int:
        return 1 + max((s.depth for s in self.slices), default=0)


@dataclass
class Counter:
    name: str
    # (ts in microseconds, {series: value}), in time order.
    points: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    @property
    def series(self) -> list[str]:
        names: list[str] = []
        for _, values in self.points:
            for k in values:
                if k not in names:
                    names.append(k)
        return names


def load_font(size: int, bold: bool = False) -> ImageFont.ImageFont:
    names = ["DejaVuSans-Bold.ttf", "Arial Bold.ttf"] if bold else ["DejaVuSans.ttf", "Arial.ttf"]
    for name in names:
        for base in ("", "/usr/share/fonts/truetype/dejavu/", "/Library/Fonts/"):
            try:
                return ImageFont.truetype(base + name, size)
            except OSError:
                continue
    return ImageFont.load_default(size)


def colour_for(name: str) -> tuple[int, int, int]:
    # Stable across runs (Python's hash() is salted); digits are dropped so
    # "step 0", "step 1"... share a colour, as Perfetto does.
    key = "".join(c for c in name if not c.isdigit()).strip()
    return PALETTE[zlib.crc32(key.encode()) % len(PALETTE)]


def text_colour(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    r, g, b = rgb
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


def parse(path: Path) -> tuple[str, list[Track], list[Counter]]:
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes: dict[int, str] = {}
    tracks: dict[tuple[int, int], Track] = {}
    counters: dict[tuple[int, str], Counter] = {}

    def track(pid: int, tid: int) -> Track:
        key = (pid, tid)
        if key not in tracks:
            tracks[key] = Track(pid, tid, f"thread {tid}", tid)
        return tracks[key]

    for e in events:
        ph, pid, tid = e.get("ph"), e.get("pid", 0), e.get("tid", 0)
        args = e.get("args", {})
        if ph == "M" and e.get("name") == "process_name":
            processes[pid] = args.get("name", f"process {pid}")
        elif ph == "M" and e.get("name") == "thread_name":
            track(pid, tid).name = args.get("name", f"thread {tid}")
        elif ph == "M" and e.get("name") == "thread_sort_index":
            track(pid, tid).sort_index = args.get("sort_index", tid)
        elif ph == "X":
            depth = args.get("depth")
            track(pid, tid).slices.append(
                Slice(e.get("name", "?"), float(e["ts"]), float(e.get("dur", 0)), depth)
            )
        elif ph == "i":
            track(pid, tid).instants.append((float(e["ts"]), e.get("name", "?")))
        elif ph == "C":
            key = (pid, e.get("name", "?"))
            counters.setdefault(key, Counter(key[1])).points.append(
                (float(e["ts"]), {k: float(v) for k, v in args.items()})
            )

    for t in tracks.values():
        infer_depths(t.slices)
    ordered = sorted(
        (t for t in tracks.values() if t.slices or t.instants),
        key=lambda t: (t.pid, t.sort_index, t.tid),
    )
    for c in counters.values():
        c.points.sort(key=lambda p: p[0])
    # The device's counters first, then the streams', by name.
    counter_list = sorted(
        counters.values(), key=lambda c: (not c.name.startswith("GPU"), len(c.name), c.name)
    )
    title = " / ".join(processes[p] for p in sorted(processes)) or path.name
    return title, ordered, counter_list


COUNTER_H = 64
SERIES_COLOURS = [(0x42, 0x85, 0xF4), (0xDB, 0x44, 0x37), (0x0F, 0x9D, 0x58)]


def fmt_bytes(v: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def track_height(t: "Track") -> int:
    """Room for the track's nesting levels, and at least for its label."""
    return max(t.levels * (ROW_H + ROW_GAP) + 2 * TRACK_PAD, LABEL_H)


def infer_depths(slices: list[Slice]) -> None:
    """Fill in depths the trace left out, by containment (as viewers do)."""
    slices.sort(key=lambda s: (s.ts, -s.dur))
    open_ends: list[float] = []
    for s in slices:
        while open_ends and open_ends[-1] <= s.ts:
            open_ends.pop()
        if s.depth is None:
            s.depth = len(open_ends)
        open_ends.append(s.ts + s.dur)


def nice_step(span_ms: float, max_ticks: int) -> float:
    raw = span_ms / max_ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def fmt_ms(v: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{v:.{decimals}f} ms"


def fit(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str | None:
    if draw.textlength(text, font=font) <= width:
        return text
    while len(text) > 1:
        text = text[:-1]
        if draw.textlength(text + "…", font=font) <= width:
            return text + "…"
    return None


def render(trace: Path, out: Path, width: int, title: str | None) -> None:
    proc_title, tracks, counters = parse(trace)
    if not any(t.slices for t in tracks):
        raise SystemExit(f"{trace}: no complete (\"ph\":\"X\") events")
    title = title or proc_title
    starts = [s.ts for t in tracks for s in t.slices] + [i[0] for t in tracks for i in t.instants]
    t0 = min(0.0, min(starts))
    t1 = max(
        [s.ts + s.dur for t in tracks for s in t.slices]
        + [i[0] for t in tracks for i in t.instants]
        + [p[0] for c in counters for p in c.points]
    )
    span = (t1 - t0) * 1.02  # a little room after the last slice

    font = load_font(13)
    font_small = load_font(12)
    font_bold = load_font(14, bold=True)
    font_title = load_font(16, bold=True)

    # Legend entries: the colour of every name (narrow slices carry no text),
    # laid out in rows that wrap at the right margin, then a note line.
    entries: dict[str, str] = {}
    for n in sorted({s.name for t in tracks for s in t.slices}):
        key = "".join(c for c in n if not c.isdigit()).strip()
        entries.setdefault(key, n if key == n else key + " N")
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    legend_rows: list[list[tuple[str, str, int]]] = [[]]
    lx = 12
    for key, shown in entries.items():
        w = 20 + int(measure.textlength(shown, font=font)) + 24
        if legend_rows[-1] and lx + w > width - MARGIN_R:
            legend_rows.append([])
            lx = 12
        legend_rows[-1].append((key, shown, lx))
        lx += w
    legend_h = 12 + LEGEND_ROW_H * (len(legend_rows) + 1)

    title_h, axis_h = 34, 30
    tracks_h = sum(track_height(t) for t in tracks) + COUNTER_H * len(counters)
    height = title_h + axis_h + tracks_h + legend_h
    img = Image.new("RGB", (width, height), BACKGROUND)
    d = ImageDraw.Draw(img)

    x0, x1 = LABEL_W, width - MARGIN_R
    def x_of(us: float) -> float:
        return x0 + (us - t0) / span * (x1 - x0)

    d.text((12, 9), title, font=font_title, fill=TEXT)

    # Time axis and grid.
    axis_y = title_h
    top = title_h + axis_h
    bottom = top + tracks_h
    d.rectangle([0, axis_y, width, top - 1], fill=LABEL_BG)
    d.line([0, top - 1, width, top - 1], fill=TRACK_RULE)
    step = nice_step(span / 1000, max(2, (x1 - x0) // 110))
    v = math.ceil(t0 / 1000 / step) * step
    while v * 1000 <= t0 + span:
        x = round(x_of(v * 1000))
        d.line([x, top, x, bottom], fill=GRID)
        d.line([x, top - 8, x, top - 1], fill=MUTED)
        d.text((x + 3, axis_y + 5), fmt_ms(v, step), font=font_small, fill=MUTED)
        v += step

    # Tracks.
    y = top
    for t in tracks:
        h = track_height(t)
        d.rectangle([0, y, LABEL_W - 1, y + h - 1], fill=LABEL_BG)
        d.text((12, y + TRACK_PAD + 4), t.name, font=font_bold, fill=TEXT)
        busy = f"{len(t.slices)} slices"
        if t.instants:
            busy += f", {len(t.instants)} allocs/frees"
        d.text((12, y + TRACK_PAD + 24), busy, font=font_small, fill=MUTED)
        # Narrow slices last, so a wide neighbour never paints over them.
        for s in sorted(t.slices, key=lambda s: (s.depth, -s.dur)):
            sy = y + TRACK_PAD + s.depth * (ROW_H + ROW_GAP)
            a, b = x_of(s.ts), x_of(s.ts + s.dur)
            ax, bx = round(a), max(round(b) - 1, round(a) + 1)  # at least 2 px wide
            rgb = colour_for(s.name)
            # A darker edge keeps back-to-back slices of one name apart.
            edge = tuple(int(c * 0.7) for c in rgb) if bx - ax >= 4 else rgb
            d.rectangle([ax, sy, bx, sy + ROW_H - 1], fill=rgb, outline=edge)
            label = fit(d, s.name, font, bx - ax - 8) if bx - ax >= MIN_TEXT_W else None
            if label:
                tw = d.textlength(label, font=font)
                tx = ax + (bx - ax - tw) / 2
                d.text((tx, sy + 4), label, font=font, fill=text_colour(rgb))
        for ts, name in t.instants:
            x = round(x_of(ts))
            colour = (0x0F, 0x9D, 0x58) if name.startswith("alloc") else (0xDB, 0x44, 0x37)
            d.polygon([(x - 4, y + 1), (x + 4, y + 1), (x, y + 7)], fill=colour)
        y += h
        d.line([0, y - 1, width, y - 1], fill=TRACK_RULE)
    for c in counters:
        h = COUNTER_H
        d.rectangle([0, y, LABEL_W - 1, y + h - 1], fill=LABEL_BG)
        d.text((12, y + 6), c.name, font=font_bold, fill=TEXT)
        series = c.series
        peak = max((v for _, vals in c.points for v in vals.values()), default=0) or 1
        legend = ", ".join(
            f"{k} (max {fmt_bytes(max(vals.get(k, 0) for _, vals in c.points))})" for k in series
        )
        d.text((12, y + 26), fit(d, legend, font_small, LABEL_W - 16) or "", font=font_small, fill=MUTED)
        base, top_y = y + h - 6, y + 8
        def y_of(v: float) -> float:
            return base - v / peak * (base - top_y)
        for index, key in enumerate(series):
            colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
            pts: list[tuple[float, float]] = []
            last = None
            for ts, vals in c.points:
                if key not in vals:
                    continue
                x = x_of(ts)
                if last is not None:
                    pts.append((x, last))
                last = y_of(vals[key])
                pts.append((x, last))
            if last is not None:
                pts.append((x1, last))
            if len(pts) < 2:
                continue
            if index == 0:
                light = tuple(int(255 - (255 - ch) * 0.35) for ch in colour)
                d.polygon(pts + [(pts[-1][0], base), (pts[0][0], base)], fill=light)
            d.line(pts, fill=colour, width=2)
        y += h
        d.line([0, y - 1, width, y - 1], fill=TRACK_RULE)
    d.line([LABEL_W - 1, title_h, LABEL_W - 1, bottom - 1], fill=TRACK_RULE)

    ly = bottom + 12
    for row in legend_rows:
        for key, shown, lx in row:
            d.rectangle([lx, ly + 2, lx + 14, ly + 16], fill=colour_for(key))
            d.text((lx + 20, ly + 1), shown, font=font, fill=TEXT)
        ly += LEGEND_ROW_H
    note = f"time after the profiler's base event; last slice ends at {t1 / 1000:.3f} ms"
    d.text((12, ly + 2), note, font=font_small, fill=MUTED)

    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, optimize=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path, help="Chrome-trace JSON file")
    p.add_argument("out", type=Path, help="PNG to write")
    p.add_argument("--width", type=int, default=1600, help="image width in pixels")
    p.add_argument("--title", help="title line (default: the process names)")
    a = p.parse_args()
    render(a.trace, a.out, a.width, a.title)


if __name__ == "__main__":
    main()
