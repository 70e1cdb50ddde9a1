"""experiments/compare/plots.py: a comparison with inference-time methods is drawn as small multiples (every encoding as
trained, then one panel per encoding under its methods); one without methods keeps one panel."""
import numpy as np
import pytest

from eval import figures
from experiments.compare import plots as compare_plots
from experiments.compare.results import Variant
from model.methods import METHODS

LENGTHS = [64, 128, 256]


def variant(encoding: str, method: str = "none", shift: float = 0.0) -> Variant:
    name = encoding if method == "none" else f"{encoding}+{method}"
    v = Variant(encoding=encoding, method=method, label=name)
    for length in LENGTHS:
        v.nll[length] = {seed: 4.0 + shift + 0.01 * seed + length / 1000 for seed in (1, 2, 3)}
    v.curves = {seed: np.full(256, 0.01 * seed + shift) for seed in (1, 2, 3)}
    return v


def as_dict(*variants: Variant) -> dict[str, Variant]:
    return {v.label: v for v in variants}


def test_without_methods_every_variant_shares_one_panel():
    variants = as_dict(variant("rope"), variant("alibi"))
    assert compare_plots.panel_groups(variants) == [("", variants)]


def test_with_methods_each_encoding_that_has_some_gets_a_panel_after_the_encodings_as_trained():
    variants = as_dict(variant("rope"), variant("rope", "yarn"), variant("alibi"), variant("rope", "window"),
                       variant("alibi", "logn"), variant("none"))
    groups = compare_plots.panel_groups(variants)
    assert [title for title, _ in groups] == [compare_plots.AS_TRAINED, "rope under each method",
                                              "alibi under each method"]
    assert list(groups[0][1]) == ["rope", "alibi", "none"]
    assert list(groups[1][1]) == ["rope", "rope+yarn", "rope+window"]  # as trained first, then the methods in order
    assert list(groups[2][1]) == ["alibi", "alibi+logn"]


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions hand to figures.save (then saved as usual)."""
    seen = []
    save = figures.save

    def keep(figure, path, legend_axis=None, below=False):
        seen.append([axis for axis in figure.axes if axis.get_visible()])
        return save(figure, path, legend_axis, below)

    monkeypatch.setattr(figures, "save", keep)
    return seen


def test_small_multiples_have_one_panel_per_group_with_its_own_legend_and_method_colours(tmp_path, drawn):
    variants = as_dict(variant("rope"), variant("rope", "yarn", 0.1), variant("rope", "window", -0.1),
                       variant("alibi"), variant("alibi", "logn", 0.05))
    compare_plots.plot_with_bands(variants, LENGTHS, lambda v, n: v.ppl(n), tmp_path / "plot.png", ("ppl", "t"),
                                  128, log_y=True)
    compare_plots.plot_position_penalty(variants, 256, 128, tmp_path / "position_loss.png")
    for axes in drawn:
        assert len(axes) == 3
        labels = [axis.get_legend_handles_labels()[1] for axis in axes]
        assert labels == [["rope", "alibi"], ["rope", "rope+yarn", "rope+window"], ["alibi", "alibi+logn"]]
        first = {line.get_label(): line.get_color() for line in axes[0].get_lines()}
        assert first["rope"] == figures.colour("rope") and first["alibi"] == figures.colour("alibi")
        rope = {line.get_label(): line.get_color() for line in axes[1].get_lines()}
        assert rope["rope"] == "#000000"  # as trained: black beside its methods
        assert rope["rope+yarn"] == figures.method_colour("yarn") != rope["rope+window"]
        assert axes[0].get_ylim() == axes[1].get_ylim() == axes[2].get_ylim()  # shared axes: panels compare
    assert (tmp_path / "plot.png").stat().st_size > 0 and (tmp_path / "position_loss.png").stat().st_size > 0
    assert not list(tmp_path.glob("*.svg"))  # one file per figure


def test_a_comparison_without_methods_keeps_one_panel_with_the_legend_beside_it(tmp_path, drawn):
    variants = as_dict(variant("rope"), variant("alibi", shift=0.2))
    compare_plots.plot_with_bands(variants, LENGTHS[1:], lambda v, n: v.ppl(n), tmp_path / "penalty.png",
                                  ("nats", "t"), 128, zero_line=True)
    (axis,) = drawn[0]
    assert axis.get_legend_handles_labels()[1] == ["rope", "alibi"]
    assert axis.get_legend().get_window_extent().x0 >= axis.get_window_extent().x1


def test_every_method_of_the_registry_has_its_own_colour_and_none_is_black():
    colours = [figures.method_colour(name) for name in list(METHODS)[1:]]
    assert len(set(colours)) == len(colours) and "#000000" not in colours
    assert figures.method_colour("none") == "#000000"
    assert figures.method_colour("yarn+logn") == figures.method_colour("yarn+logn") not in colours


def test_every_named_encoding_and_variant_has_a_colour_of_its_own():
    from eval import figures

    colours = [figures.colour(name) for name in figures.ENCODING_ORDER]
    assert len(set(colours)) == len(colours)
    assert len(figures.MARKERS) >= len(figures.ENCODING_ORDER)
