"""One look for every figure of every command: a fixed colour and marker per encoding (and comparison variant), a
fixed line style per inference-time method, legends beside the data rather than on it, and each figure written once,
as PNG (the format the markdown pages show).

    figure, axis = figures.new()
    axis.plot(x, y, **figures.style("rope", "yarn"), label="rope+yarn")
    figures.save(figure, out / "plot.png")     # writes plot.png
"""
from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Any

from model.methods import METHODS

# The order fixes the colours: tab10, then five lighter shades of tab20, then Dark2 (so that the frontier preset's
# encodings, drawn beside none, alibi, rope, kerple and fire, get no lighter shade of those), and the markers.
ENCODING_ORDER = ["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope", "kerple", "fire", "xpos", "cope",
                  "partial-rope", "p-rope", "irope", "rnope-swa", "ssmax", "fox", "stickbreaking", "dape",
                  "rope-randomized"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d", "8", "H", "o", "s", "^", "D", "v"]
# One line style per method, in the registry's order ("none" solid), so a new method needs no entry here.
DPI = 90  # pixels per inch of every figure: a 8.5-inch figure is 765 pixels wide
LINE_STYLES = ["-", (0, (1, 1)), (0, (3, 1, 1, 1)), "-.", (0, (5, 2)), "--", (0, (3, 3)), (0, (1, 3))]
METHOD_STYLES = {name: LINE_STYLES[index % len(LINE_STYLES)] for index, name in enumerate(METHODS)}


def _index(name: str) -> int:
    return ENCODING_ORDER.index(name) if name in ENCODING_ORDER else zlib.crc32(name.encode())


def colour(encoding: str) -> str:
    """The colour of an encoding or variant, the same in every figure (unknown names get a stable one)."""
    import matplotlib

    palette = (list(matplotlib.colormaps["tab10"].colors) + list(matplotlib.colormaps["tab20"].colors[1:10:2])
               + list(matplotlib.colormaps["Dark2"].colors))
    return matplotlib.colors.to_hex(palette[_index(encoding) % len(palette)])


def marker(encoding: str) -> str:
    return MARKERS[_index(encoding) % len(MARKERS)]


def method_style(method: str) -> Any:
    """The line style of an inference-time method or composition (its first part's); "none" is solid."""
    return METHOD_STYLES.get(method, METHOD_STYLES.get(method.split("+")[0], "--"))


def method_colour(method: str) -> str:
    """The colour of an inference-time method (a composition: its whole name), the same in every figure; black for
    the model as trained. For panels that put one encoding under several methods."""
    import matplotlib

    if method == "none":
        return "#000000"
    # The most distinct hues first (a method panel holds one encoding, so they may repeat the encodings' colours);
    # Dark2 without its grey, then five lighter shades of tab20, for the rest and for compositions.
    palette = (list(matplotlib.colormaps["tab10"].colors) + list(matplotlib.colormaps["Dark2"].colors)[:7]
               + list(matplotlib.colormaps["tab20"].colors[1:10:2]))
    names = list(METHODS)[1:]  # the registry's methods take the first colours; compositions share the rest
    if method in names:
        index = names.index(method)
    else:
        index = len(names) + zlib.crc32(method.encode()) % max(1, len(palette) - len(names))
    return matplotlib.colors.to_hex(palette[index % len(palette)])


def style(encoding: str, method: str = "none") -> dict[str, Any]:
    """plot() keywords for a line of `encoding` under `method`."""
    return {"color": colour(encoding), "marker": marker(encoding), "linestyle": method_style(method)}


def line_styles(lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """plot() keywords for lines of (encoding, method) that share one figure: as trained, the encoding's colour; under
    a method, the method's colour (method_colour); each with the encoding's marker and the method's line style. The
    lines as trained choose first, in order, so an encoding keeps its colour in every figure; a colour already taken
    goes to the next one no line has, so every line has a colour of its own (two checkpoints of one encoding, a
    method whose colour is an encoding's)."""
    import matplotlib

    spare = [matplotlib.colors.to_hex(c) for c in [*matplotlib.colormaps["tab10"].colors,
                                                    *matplotlib.colormaps["Dark2"].colors[:7]]]
    wanted = [colour(encoding) if method == "none" else method_colour(method) for encoding, method in lines]
    taken: set[str] = set()
    styles: list[dict[str, Any]] = [{} for _ in lines]
    for index in sorted(range(len(lines)), key=lambda i: lines[i][1] != "none"):  # as trained first, stable
        (encoding, method), hue = lines[index], wanted[index]
        if hue in taken:
            hue = next((c for c in spare if c not in taken and c not in wanted), hue)
        taken.add(hue)
        styles[index] = {"color": hue, "marker": marker(encoding), "linestyle": method_style(method)}
    return styles


def plain_numbers(axis: Any) -> None:
    """Tick labels of a log-scale axis as plain numbers (450, 500) rather than powers (4.5 x 10^2)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}"))


# Where a point's label may go, in points from the point, nearest first: right, left, above, below, the diagonals,
# then the same directions further out.
LABEL_OFFSETS = [(5, 3), (-5, 3), (0, 8), (0, -11), (5, -9), (-5, -9), (5, 12), (-5, 12),
                 (14, 8), (-14, 8), (14, -14), (-14, -14), (0, 20), (0, -22), (24, 0), (-24, 0)]


def place_labels(axis: Any, anchors: list[tuple[float, float, str]], fontsize: float = 7) -> list[Any]:
    """Label each (x, y, text) point of `axis` where the text overlaps no label placed before it, no other point and
    stays inside the axes: the first free offset of LABEL_OFFSETS, else the one that overlaps least; a label put
    further than the nearest ring gets a thin leader line. Call after the axis limits are final. Returns the texts."""
    figure = axis.figure
    renderer = figure.canvas.get_renderer()
    box = axis.get_window_extent(renderer)
    scale = figure.dpi / 72.0
    points = [axis.transData.transform((x, y)) for x, y, _ in anchors]
    marks = [(px - 4 * scale, py - 4 * scale, px + 4 * scale, py + 4 * scale) for px, py in points]
    placed: list[tuple[float, float, float, float]] = []
    texts = []

    def overlap(a: tuple, b: tuple) -> float:
        width, height = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
        return width * height if width > 0 and height > 0 else 0.0

    for index, ((x, y, label), (px, py)) in enumerate(zip(anchors, points)):
        best = None
        for dx, dy in LABEL_OFFSETS:
            text = axis.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                                 ha="left" if dx > 0 else "right" if dx < 0 else "center",
                                 va="bottom" if dy > 0 else "top")
            extent = text.get_window_extent(renderer)
            rect = (extent.x0, extent.y0, extent.x1, extent.y1)
            outside = max(0.0, box.x0 - rect[0]) + max(0.0, rect[2] - box.x1) + max(0.0, box.y0 - rect[1]) + \
                max(0.0, rect[3] - box.y1)
            cost = sum(overlap(rect, other) for other in placed) + \
                sum(overlap(rect, mark) for other, mark in enumerate(marks) if other != index) + outside * 100
            text.remove()
            if best is None or cost < best[0]:
                best = (cost, dx, dy, rect)
            if cost == 0:
                break
        _, dx, dy, rect = best
        far = abs(dx) > 6 or abs(dy) > 12
        text = axis.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                             ha="left" if dx > 0 else "right" if dx < 0 else "center",
                             va="bottom" if dy > 0 else "top",
                             arrowprops={"arrowstyle": "-", "linewidth": 0.5, "color": "0.4"} if far else None)
        placed.append(rect)
        texts.append(text)
    return texts


def _pyplot():
    """matplotlib.pyplot on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def new(columns: int = 1, width: float = 8.5, height: float = 5.2):
    """A figure and its axes (one, or a list of `columns`), on the non-interactive backend."""
    return _pyplot().subplots(1, columns, figsize=(width, height))


def grid(rows: int, columns: int, panel_width: float = 4.4, panel_height: float = 3.3):
    """A figure of rows x columns panels sharing their x and y axes, and the 2-D array of its axes."""
    return _pyplot().subplots(rows, columns, figsize=(columns * panel_width, rows * panel_height), sharex=True,
                              sharey=True, squeeze=False)


def save(figure, path: Path, legend_axis=None, below: bool = False) -> Path:
    """Put the legend of `legend_axis` (if it has labelled lines) outside the data: to the right of that axis, or
    with `below` under the whole figure (for rows of panels); write the figure as `path` (PNG, one file per figure:
    a committed report keeps one format) at DPI, a size that reads on a screen; returns `path`."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    if legend_axis is not None and legend_axis.get_legend_handles_labels()[0]:
        handles, labels = legend_axis.get_legend_handles_labels()
        if below:
            figure.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                          ncol=min(6, len(labels)))
        else:
            legend_axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    path = Path(path)
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    import matplotlib
    from PIL import Image, PngImagePlugin  # matplotlib's own dependency

    # a palette of 256 colours: lines, bands and text on white lose nothing visible, and the file is a third
    made = PngImagePlugin.PngInfo()
    made.add_text("Software", f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/")
    Image.open(drawn).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True,
                                                                                         pnginfo=made)
    return path
