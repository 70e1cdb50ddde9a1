"""eval/figures.py: fixed colours and markers, legends outside the data, one PNG per figure."""
import numpy as np
from matplotlib.text import Text

from eval import figures


def test_every_known_encoding_has_its_own_colour_and_unknown_names_a_stable_one():
    colours = [figures.colour(name) for name in figures.ENCODING_ORDER]
    assert len(set(colours)) == len(colours)
    assert figures.colour("rope") == figures.colour("rope") == "#e377c2"  # tab10, 7th: the colour rope has had
    assert figures.colour("my-variant") == figures.colour("my-variant")
    assert figures.style("rope", "yarn")["linestyle"] != figures.style("rope")["linestyle"]
    assert figures.method_style("yarn+logn") == figures.method_style("yarn")


def test_save_writes_one_png_with_the_legend_beside_the_data(tmp_path):
    figure, axis = figures.new()
    axis.plot(np.arange(10), np.arange(10), **figures.style("alibi"), label="alibi")
    path = figures.save(figure, tmp_path / "plot.png", axis)
    assert path.read_bytes().startswith(b"\x89PNG") and sorted(tmp_path.iterdir()) == [path]  # one file per figure
    legend = axis.get_legend().get_window_extent()
    assert legend.x0 >= axis.get_window_extent().x1  # right of the axes: it covers no data


def test_labels_of_points_that_nearly_coincide_do_not_overlap():
    """The extrapolation map's points crowd at x = 0 and y = 1: every label finds a place of its own."""
    figure, axis = figures.new(width=5.0, height=4.0)
    anchors = [(0.0, 1.0, "alibi"), (0.005, 0.99, "stickbreaking"), (0.002, 0.985, "fox"), (0.22, 1.0, "none"),
               (0.235, 1.0, "rope+yarn"), (0.23, 0.995, "sinusoidal+window"), (0.5, 0.3, "rope")]
    for x, y, _ in anchors:
        axis.plot(x, y, "o")
    axis.set_xlim(-0.05, 0.7)
    axis.set_ylim(-0.03, 1.03)
    texts = figures.place_labels(axis, anchors)
    figure.canvas.draw()  # places the annotations
    renderer = figure.canvas.get_renderer()
    boxes = [Text.get_window_extent(text, renderer) for text in texts]  # the text alone, not its leader line
    assert [text.get_text() for text in texts] == [label for _, _, label in anchors]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    # Without the placement (every label at one offset) the same labels overlap: the check can fail.
    naive = [axis.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7).get_window_extent(
        renderer) for x, y, label in anchors]
    assert any(a.overlaps(b) for i, a in enumerate(naive) for b in naive[i + 1:])
