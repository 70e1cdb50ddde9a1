"""eval/figures.py: fixed colours and markers, legends outside the data, PNG and SVG side by side."""
import numpy as np

from eval import figures


def test_every_known_encoding_has_its_own_colour_and_unknown_names_a_stable_one():
    colours = [figures.colour(name) for name in figures.ENCODING_ORDER]
    assert len(set(colours)) == len(colours)
    assert figures.colour("rope") == figures.colour("rope") == "#e377c2"  # tab10, 7th: the colour rope has had
    assert figures.colour("my-variant") == figures.colour("my-variant")
    assert figures.style("rope", "yarn")["linestyle"] != figures.style("rope")["linestyle"]
    assert figures.method_style("yarn+logn") == figures.method_style("yarn")


def test_save_writes_png_and_svg_with_the_legend_beside_the_data(tmp_path):
    figure, axis = figures.new()
    axis.plot(np.arange(10), np.arange(10), **figures.style("alibi"), label="alibi")
    path = figures.save(figure, tmp_path / "plot.png", axis)
    assert path.stat().st_size > 0 and (tmp_path / "plot.svg").read_text().startswith("<?xml")
    assert figures.colour("alibi") in (tmp_path / "plot.svg").read_text()
    legend = axis.get_legend().get_window_extent()
    assert legend.x0 >= axis.get_window_extent().x1  # right of the axes: it covers no data
