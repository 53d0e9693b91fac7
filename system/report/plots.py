"""The report's figures as inline SVG charts, computed with numpy alone (no plotting library).

Each function bins all valid tokens (``np.histogram`` / ``np.bincount``: one pass, nothing
subsampled) and returns a *chart*: a plain dict of pixel geometry and labels that the page
template draws as ``<svg>`` (``templates/report.html.j2``, macro ``chart``), so every label
goes through the template's autoescaping. The 2-D density's cells travel as a small PNG
(encoded here with zlib) inside the SVG. Cost: a few ms per figure plus the binning; no
matplotlib import (about 0.4 s) and no rasterising (about 0.3 s for four figures).

Chart dict: ``width``, ``height``, ``title``, ``xlabel``, ``ylabel``, ``box`` (plot area
x, y, w, h), ``xticks`` / ``yticks`` (lists of ``{"at": pixel, "label": str}``), ``bands``
(rectangles ``{"x", "y", "w", "h", "color", "opacity"}``), ``paths`` (``{"d", "fill",
"stroke"}``), ``rects`` (``{"x", "y", "w", "h", "color"}``), ``lines`` (``{"x1", "y1", "x2",
"y2", "color", "dash"}``), ``image`` (``{"x", "y", "w", "h", "png"}`` or None), ``colorbar``
(None or ``{"x", "y", "w", "h", "png", "ticks"}``), ``legend`` (``{"color", "label"}``) placed at ``legend_at`` (``{"x", "y", "row"}``: a column, or a row).
"""

import base64
import math
import struct
import zlib

import numpy as np

BLUE = "#3b6ea8"
YELLOW = "#f0b429"
RED = "#d64545"
METHOD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_RATIO_TICKS = (1e-8, 1e-6, 1e-4, 1e-3, 0.01, 0.1, 0.2, 0.5, 1, 2, 5, 10, 100, 1e3, 1e4, 1e6, 1e8)
_VIRIDIS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64)
DENSITY_BINS = 128
DENSITY_LOW_QUANTILE = 1e-3
"""The density plot spans log-probs from this quantile up to 0; lower values go in the edge bin."""
_QUANTILE_SAMPLE = 1 << 20
_COUNT_FLOOR = 0.7
"""Empty histogram bins are drawn at this height on the log count axis (below 1)."""


def _r(v: float) -> float:
    return round(float(v), 1)


class _Frame:
    """Maps data coordinates to pixels inside the plot box (y grows upwards in data)."""

    def __init__(self, box, xlim, ylim, xlog=False, ylog=False):
        self.x0, self.y0, self.w, self.h = box
        self.xlog, self.ylog = xlog, ylog
        self.xlim = tuple(math.log10(v) for v in xlim) if xlog else xlim
        self.ylim = tuple(math.log10(v) for v in ylim) if ylog else ylim

    def x(self, v):
        v = np.log10(v) if self.xlog else np.asarray(v, np.float64)
        lo, hi = self.xlim
        return self.x0 + (v - lo) / (hi - lo) * self.w

    def y(self, v):
        v = np.log10(np.maximum(v, 1e-300)) if self.ylog else np.asarray(v, np.float64)
        lo, hi = self.ylim
        return self.y0 + self.h - (v - lo) / (hi - lo) * self.h


def _chart(width, height, title="", xlabel="", ylabel="", box=None) -> dict:
    box = box or (58, 28, width - 74, height - 72)
    return {"width": width, "height": height, "title": title, "xlabel": xlabel, "ylabel": ylabel,
            "box": [_r(v) for v in box], "xticks": [], "yticks": [], "bands": [], "paths": [],
            "rects": [], "lines": [], "image": None, "colorbar": None, "legend": [],
            "legend_at": {"x": _r(box[0] + 10), "y": _r(box[1] + 14), "row": False}}


def _tick_label(v: float) -> str:
    return f"{v:g}"


def _log_count_ticks(frame: _Frame, top: float) -> list[dict]:
    ticks, power = [], 0
    while 10**power <= top:
        ticks.append({"at": _r(frame.y(10.0**power)), "label": _tick_label(10.0**power)})
        power += 1 if top < 1e5 else 2
    return ticks


def _linear_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (about n of them)."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= raw:
            step *= m
            break
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + k * step, 10) for k in range(int((hi - first) / step + 1e-9) + 1)]


def _stairs(frame: _Frame, counts: np.ndarray, edges_px: np.ndarray) -> str:
    """A closed step outline of ``counts`` over bins with pixel edges ``edges_px``."""
    heights = frame.y(np.maximum(counts, _COUNT_FLOOR))
    base = _r(frame.y(_COUNT_FLOOR))
    parts = [f"M{_r(edges_px[0])} {base}"]
    for k, top in enumerate(heights):
        parts.append(f"V{_r(top)}H{_r(edges_px[k + 1])}")
    parts.append(f"V{base}Z")
    return "".join(parts)


def _log_count_frame(chart: dict, counts: np.ndarray, xlim, xlog=False) -> _Frame:
    top = max(float(counts.max(initial=1)), 1.0) * 1.6
    frame = _Frame(chart["box"], xlim, (_COUNT_FLOOR, top), xlog=xlog, ylog=True)
    chart["yticks"] = _log_count_ticks(frame, top)
    return frame


def ratio_histogram(dc: np.ndarray) -> dict:
    """Per-token ratio ``exp(dc)`` on a log axis (120 bins), with the r = 1 line and the 2x / 5x bands."""
    chart = _chart(560, 300, xlabel="token ratio pi_train / pi_rollout (log scale)", ylabel="tokens (log)")
    lo = min(float(dc.min(initial=0.0)), -math.log(10.0))
    hi = max(float(dc.max(initial=0.0)), math.log(10.0))
    log_edges = np.linspace(lo, hi, 121)
    counts, _ = np.histogram(dc, bins=log_edges)
    frame = _log_count_frame(chart, counts, (lo, hi))  # x in log-ratio units: a log ratio axis
    top, bottom = chart["box"][1], chart["box"][1] + chart["box"][3]
    for a, b, color, alpha in ((lo, -math.log(5), RED, 0.12), (-math.log(5), -math.log(2), YELLOW, 0.18),
                               (math.log(2), math.log(5), YELLOW, 0.18), (math.log(5), hi, RED, 0.12)):
        a, b = max(a, lo), min(b, hi)
        if b > a:
            chart["bands"].append({"x": _r(frame.x(a)), "y": top, "w": _r(frame.x(b) - frame.x(a)),
                                   "h": _r(bottom - top), "color": color, "opacity": alpha})
    chart["paths"].append({"d": _stairs(frame, counts, frame.x(log_edges)), "fill": BLUE, "stroke": "none"})
    chart["lines"].append({"x1": _r(frame.x(0.0)), "y1": top, "x2": _r(frame.x(0.0)), "y2": bottom,
                           "color": "#000", "dash": ""})
    chart["xticks"] = [{"at": _r(frame.x(math.log(t))), "label": _tick_label(t)}
                       for t in _RATIO_TICKS if lo <= math.log(t) <= hi]
    chart["legend"] = [{"color": YELLOW, "label": "2x-5x"}, {"color": RED, "label": "beyond 5x"},
                       {"color": "#000", "label": "r = 1"}]
    chart["counts"] = counts
    return chart


def prob_diff_histogram(abs_prob_diff: np.ndarray) -> dict:
    """Histogram of ``|p_train - p_rollout|`` per token (100 bins over [0, 1])."""
    chart = _chart(560, 300, xlabel="|p_train - p_rollout|", ylabel="tokens (log)")
    edges = np.linspace(0.0, 1.0, 101)
    counts, _ = np.histogram(abs_prob_diff, bins=edges)
    frame = _log_count_frame(chart, counts, (0.0, 1.0))
    chart["paths"].append({"d": _stairs(frame, counts, frame.x(edges)), "fill": BLUE, "stroke": "none"})
    chart["xticks"] = [{"at": _r(frame.x(t)), "label": _tick_label(t)} for t in _linear_ticks(0.0, 1.0, 5)]
    chart["counts"] = counts
    return chart


def png_rgba(pixels: np.ndarray) -> str:
    """Base64 PNG of a ``[H, W, 4]`` uint8 RGBA image (8 bits, no interlace, filter 0 on every row)."""
    h, w, _ = pixels.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), pixels.reshape(h, w * 4)], axis=1).tobytes()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode("ascii")


def _viridis(t: np.ndarray) -> np.ndarray:
    """RGB in [0, 255] of t in [0, 1] along a 5-point approximation of viridis."""
    anchors = np.linspace(0.0, 1.0, len(_VIRIDIS))
    return np.stack([np.interp(t, anchors, _VIRIDIS[:, c]) for c in range(3)], axis=-1)


def density_counts(behaviour: np.ndarray, proximal: np.ndarray, bins: int = DENSITY_BINS) -> tuple[np.ndarray, float]:
    """Token counts on a ``bins x bins`` grid over ``[lo, 0]**2`` (row = proximal, column = behaviour) and ``lo``.

    ``lo`` is the lower of the two ``DENSITY_LOW_QUANTILE`` quantiles (at most -1; over a
    strided sample of about 1M values for larger inputs); values outside the square are counted
    in its edge bins.
    """
    if behaviour.size == 0:
        return np.zeros((bins, bins), np.int64), -1.0
    stride = max(1, behaviour.size // _QUANTILE_SAMPLE)  # the range only frames the plot: a strided sample will do
    lo = min(float(np.quantile(behaviour[::stride], DENSITY_LOW_QUANTILE)),
             float(np.quantile(proximal[::stride], DENSITY_LOW_QUANTILE)), -1.0)
    scale = bins / (0.0 - lo)

    def index(x: np.ndarray) -> np.ndarray:
        return np.clip(np.floor((x - lo) * scale), 0, bins - 1).astype(np.int64)

    flat = index(proximal) * bins + index(behaviour)
    return np.bincount(flat, minlength=bins * bins).reshape(bins, bins), lo


def logprob_density(behaviour: np.ndarray, proximal: np.ndarray, pearson: float | None) -> dict:
    """Trainer vs rollout log-prob of every valid token as a 2-D density (log colour scale), against y = x."""
    counts, lo = density_counts(behaviour, proximal)
    r = "n/a" if pearson is None else f"{pearson:.4f}"
    chart = _chart(460, 400, title=f"Pearson r = {r}", xlabel="rollout log-prob (mu)",
                   ylabel="trainer log-prob (old)", box=(58, 28, 330, 330))
    frame = _Frame(chart["box"], (lo, 0.0), (lo, 0.0))
    vmax = max(int(counts.max(initial=1)), 2)
    t = np.log(np.maximum(counts, 1)) / math.log(vmax)
    rgba = np.zeros(counts.shape + (4,), np.uint8)
    rgba[..., :3] = _viridis(t).round().astype(np.uint8)
    rgba[..., 3] = np.where(counts > 0, 255, 0)
    x, y, w, h = chart["box"]
    chart["image"] = {"x": x, "y": y, "w": w, "h": h, "png": png_rgba(rgba[::-1])}
    chart["lines"].append({"x1": _r(frame.x(lo)), "y1": _r(frame.y(lo)), "x2": _r(frame.x(0.0)),
                           "y2": _r(frame.y(0.0)), "color": "#000", "dash": ""})
    ticks = _linear_ticks(lo, 0.0, 6)
    chart["xticks"] = [{"at": _r(frame.x(v)), "label": _tick_label(v)} for v in ticks]
    chart["yticks"] = [{"at": _r(frame.y(v)), "label": _tick_label(v)} for v in ticks]
    bar = np.linspace(1.0, 0.0, 64)[:, None] * np.ones((1, 4))
    bar_rgba = np.concatenate([_viridis(bar).round().astype(np.uint8), np.full((64, 4, 1), 255, np.uint8)], axis=-1)
    cb = {"x": x + w + 14, "y": y, "w": 12, "h": h, "png": png_rgba(bar_rgba)}
    cb["ticks"] = [{"at": _r(y + h - math.log(v) / math.log(vmax) * h), "label": _tick_label(v)}
                   for v in (10.0**p for p in range(0, int(math.log10(vmax)) + 1))]
    chart["colorbar"] = cb
    chart["legend"] = [{"color": "#000", "label": "y = x"}]
    chart["counts"] = counts
    return chart


def keep_by_length(methods: dict[str, dict]) -> dict:
    """Kept sequence fraction of each method by response-length bucket (empty buckets left blank)."""
    buckets = ["<=128", "<=512", "<=2048", ">2048"]
    chart = _chart(560, 300, xlabel="response length (tokens)", ylabel="kept sequence fraction",
                   box=(58, 28, 486, 200))
    frame = _Frame(chart["box"], (0.0, float(len(buckets))), (0.0, 1.05))
    width = 0.8 / max(len(methods), 1)
    for k, (name, stats) in enumerate(methods.items()):
        color = METHOD_COLORS[k % len(METHOD_COLORS)]
        for b, bucket in enumerate(buckets):
            value = stats["keep_seq_frac_by_len"].get(bucket)
            if value is None:
                continue
            left = b + 0.1 + k * width
            chart["rects"].append({"x": _r(frame.x(left)), "y": _r(frame.y(value)),
                                   "w": _r(frame.x(left + width) - frame.x(left)),
                                   "h": _r(frame.y(0.0) - frame.y(value)), "color": color})
        chart["legend"].append({"color": color, "label": name})
    chart["legend_at"] = {"x": 58, "y": 286, "row": True}
    chart["xticks"] = [{"at": _r(frame.x(b + 0.5)), "label": bucket} for b, bucket in enumerate(buckets)]
    chart["yticks"] = [{"at": _r(frame.y(v)), "label": _tick_label(v)} for v in (0, 0.2, 0.4, 0.6, 0.8, 1.0)]
    return chart
