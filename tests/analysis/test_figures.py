"""Figures: tidy DataFrame in, Figure out; empty and single-value groups never crash."""

import numpy as np
import pandas as pd
import pytest
from attnstudy.analysis import figures
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def steps(n=40, variants=("copy additive-bahdanau", "g2p general-luong"), seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for v in variants:
        for i in range(n):
            rows.append(
                {
                    "variant": v,
                    "example_id": f"ex{i % 8}",
                    "step": i,
                    "max_attention": rng.uniform(0.1, 1),
                    "permutation_median_tvd": rng.uniform(0, 0.5),
                    "adversarial_max_jsd": rng.uniform(0, 0.6),
                    "importance_tau_attn_grad": rng.uniform(-1, 1),
                    "importance_tau_attn_loo": rng.uniform(-1, 1),
                    "importance_tau_grad_loo": rng.uniform(-1, 1),
                    "erase_attn_desc_frac_positions": rng.uniform(0, 1),
                    "erase_attn_desc_frac_mass": rng.uniform(0, 1),
                    "erase_random_frac_positions": rng.uniform(0, 1),
                    "erase_random_frac_mass": rng.uniform(0, 1),
                    "alignment_gold_mass": rng.uniform(0, 1) if v.startswith("copy") else np.nan,
                }
            )
    return pd.DataFrame(rows)


def texts(fig):
    """Every text drawn on the figure's axes: notes and titles."""
    return " ".join(
        [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]
    )


@pytest.mark.parametrize(
    "fn",
    [
        figures.permutation_by_max_attention,
        figures.adversarial_by_max_attention,
        figures.kendall_tau,
        figures.erasure_fractions,
        figures.alignment_vs_ablation,
    ],
)
def test_figures_draw_real_data_and_survive_empty_and_single_groups(fn):
    fig = fn(steps())
    assert isinstance(fig, Figure) and fig.axes
    assert all(ax.get_ylabel() for ax in fig.axes if ax.has_data())
    empty = fn(steps().iloc[:0])
    assert isinstance(empty, Figure) and texts(empty)  # a note, not empty axes
    single = fn(steps(n=1, variants=("copy additive-bahdanau",)))
    assert isinstance(single, Figure)


def test_alignment_panel_prints_rank_correlation_and_says_when_no_gold():
    fig = figures.alignment_vs_ablation(steps())
    assert "τ =" in texts(fig) and "copy additive-bahdanau" in texts(fig)
    no_gold = figures.alignment_vs_ablation(steps(variants=("g2p general-luong",)))
    assert "no gold alignments" in texts(no_gold)


def test_per_example_alignment_never_pairs_steps_across_prefixes():
    s = steps(n=16, variants=("copy additive-bahdanau",))
    table = figures.per_example_alignment(s)
    assert len(table) == 8
    ex0 = s[s.example_id == "ex0"]
    assert table.loc[table.example_id == "ex0", "gold_mass"].item() == pytest.approx(
        ex0.alignment_gold_mass.mean()
    )


def test_max_attention_bins_match_jain_wallace():
    b = figures.max_attention_bin(pd.Series([0.0, 0.24, 0.25, 0.5, 0.74, 0.75, 1.0]))
    assert list(b.astype(str)) == [
        "[0, .25)",
        "[0, .25)",
        "[.25, .5)",
        "[.5, .75)",
        "[.5, .75)",
        "[.75, 1]",
        "[.75, 1]",
    ]


def test_accuracy_by_length_and_heatmaps():
    preds = pd.DataFrame(
        {
            "task": ["copy"] * 6,
            "variant": ["a"] * 3 + ["none"] * 3,
            "src_len": [3, 8, 12] * 2,
            "correct": [True, True, False, True, False, False],
        }
    )
    fig = figures.accuracy_by_length(preds)
    assert fig.axes[0].get_ylabel() == "exact match (%)"
    heat = figures.attention_heatmaps(
        [
            {
                "title": "x",
                "source": list("abc"),
                "target": ["a", "b", "<eos>"],
                "attention": np.eye(3).tolist(),
                "adversarial": [None, [0, 1, 0], None],
                "gold": [[0, 0], [1, 1]],
            }
        ]
    )
    images = [im for ax in heat.axes for im in ax.images]
    # attention, adversarial (its step without an adversary left blank) and the gold panel
    assert len(images) == 3 and all(im.get_clim() == (0, 1) for im in images)
    adversarial = images[1].get_array()
    assert adversarial.mask[0].all() and adversarial[1].tolist() == [0, 1, 0]
    assert texts(figures.attention_heatmaps([]))


def test_seed_variance_figure_takes_the_suite_columns():
    df = pd.DataFrame(
        {
            "variant": ["a"] * 4,
            "seed_variance_attention_jsd": [0.1, 0.2, 0.3, 0.4],
            "seed_variance_output_tvd": [0.0, 0.1, 0.1, 0.2],
        }
    )
    fig = figures.seed_variance(df)
    assert fig.axes[0].has_data()
    assert "one seed" in texts(figures.seed_variance(pd.DataFrame()))


def test_a_summary_panel_never_labels_one_statistics_direction_for_all():
    """AER (lower is better) and gold mass (higher is better) share a panel: each row says its own
    scale, the panel's x axis claims none, and no tick lies beyond the largest value shown."""
    rows = [
        ("aligns", "AER", 0.2, 0.1, 0.3, "0–1, lower is better"),
        ("aligns", "gold mass", 0.9, 0.85, 0.95, "share of attention (0–1)"),
        ("used", "permutation flip rate", 0.4, 0.3, 0.5, "share of steps (0–1)"),
        ("used", "uniform flip rate", 0.2, 0.1, 0.3, "share of steps (0–1)"),
    ]
    table = pd.DataFrame(rows, columns=["group", "label", "value", "low", "high", "scale"])
    fig = figures.estimates_plot(table.assign(n=10, variant="m"))
    aligns, used = fig.axes[:2]
    ticks = [t.get_text() for t in aligns.get_yticklabels()]
    assert ticks == ["AER\n0–1, lower is better", "gold mass\nshare of attention (0–1)"]
    assert aligns.get_xlabel() == ""
    assert used.get_xlabel() == "share of steps (0–1)"  # one scale: on the axis
    assert [t.get_text() for t in used.get_yticklabels()] == [
        "permutation flip rate",
        "uniform flip rate",
    ]
    assert max(aligns.get_xticks()) <= 0.95 + 1e-9 and max(used.get_xticks()) <= 0.5 + 1e-9


def test_a_summary_of_many_models_is_one_forest_plot_per_statistic():
    """Past FOREST_ABOVE models the rows-per-statistic layout needed a legend of dozens of colours
    and 0.3 in per model and statistic (24 models, 21 statistics: 161 in tall); each statistic is
    now its own panel with the models named on its axis, a model without the statistic leaves its
    line empty, and the figure grows by rows of three panels."""
    variants = [f"dates m{i} seed{s}" for i in range(5) for s in (1, 2, 3)]  # 15 > FOREST_ABOVE
    assert len(variants) > figures.FOREST_ABOVE
    stats_ = [
        ("used", "permutation flip rate", "share of steps (0–1)"),
        ("used", "uniform flip rate", "share of steps (0–1)"),
        ("used", "uniform TVD", "TVD (0–1)"),
        ("used", "erase-max flip rate", "share of steps (0–1)"),
        ("aligns", "AER", "0–1, lower is better"),
    ]
    rows = [
        (g, lab, v, 0.1 * i + 0.01 * j, 0.1 * i, 0.1 * i + 0.02, scale)
        for i, v in enumerate(variants)
        for j, (g, lab, scale) in enumerate(stats_)
        if not (lab == "AER" and v == "dates m0 seed2")  # no gold links for this one
    ]
    table = pd.DataFrame(
        rows, columns=["group", "label", "variant", "value", "low", "high", "scale"]
    )
    fig = figures.estimates_plot(table.assign(n=300))
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == [lab for _, lab, _ in stats_]
    assert len(fig.axes) == 9  # "used": 2 rows of 3 (2 hidden); "aligns": 1 row of 3 (2 hidden)
    fig.canvas.draw()  # tick labels are laid out at drawing
    names = [[t.get_text() for t in ax.get_yticklabels() if t.get_visible()] for ax in shown]
    # named on the first panel of each row (permutation, erase-max and AER), shared by the rest
    assert names == [variants, [], [], variants, variants]
    for ax, (_, lab, scale) in zip(shown, stats_):
        assert list(ax.get_yticks()) == list(range(len(variants)))
        assert ax.get_xlabel() == scale
        points = {  # the marker of each model: (x, y), y the model's line
            int(line.get_ydata()[0]): float(line.get_xdata()[0])
            for line in ax.get_lines()
            if line.get_marker() == "o"
        }
        j = [s[1] for s in stats_].index(lab)
        expected = {
            i: 0.1 * i + 0.01 * j
            for i, v in enumerate(variants)
            if not (lab == "AER" and v == "dates m0 seed2")
        }
        assert points == pytest.approx(expected)
    # height: 0.6 + per question 0.45 + rows × (0.9 + 0.19 × 15) in
    assert fig.get_size_inches()[1] == pytest.approx(0.6 + (0.45 + 2 * 3.75) + (0.45 + 3.75))
    assert not fig.legends  # the models are named on the axes, not in a colour legend


def test_many_models_keep_legends_notes_and_counts_inside_the_figure_and_apart():
    """With 24 models the free-standing notes ran over the legend's last rows (erasure) or off the
    figure (Kendall τ: "steps per model: …" as one line), and erasure's 120 bars were too thin for
    their step counts. The note is now the legend's title, the legend takes as many columns as its
    longest entry allows, and the erasure figure grows with its bars."""
    variants = [
        f"dates {a}-luong seed{s}"
        for a in ("dot", "general", "concat", "additive", "multihead_general", "scaled_dot")
        for s in (1, 2, 3, 4)
    ]
    d = steps(n=60, variants=variants)
    rng = np.random.default_rng(1)
    for r in figures.RANKINGS:
        d[f"erase_{r}_never_flipped"] = rng.uniform(0, 1, len(d)) > 0.7
        d[f"erase_{r}_frac_positions"] = rng.uniform(0, 1, len(d))
        d[f"erase_{r}_frac_mass"] = rng.uniform(0, 1, len(d))
    for fn in (
        figures.kendall_tau,
        figures.erasure_fractions,
        figures.permutation_by_max_attention,
    ):
        fig = fn(d)
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        (legend,) = fig.legends
        entries = [t.get_window_extent(renderer) for t in legend.get_texts()]
        title = legend.get_title().get_window_extent(renderer)
        assert len(entries) == len(variants)
        for box in [*entries, title]:  # inside the figure, 1 px of rounding allowed
            assert box.x0 >= -1 and box.x1 <= fig.bbox.x1 + 1 and box.y0 >= -1
        assert not any(title.overlaps(e) for e in entries)
        for note in fig.texts:  # any free-standing text: inside, and clear of the legend
            box = note.get_window_extent(renderer)
            assert box.x0 >= -1 and box.x1 <= fig.bbox.x1 + 1 and box.y0 >= -1
            assert not any(box.overlaps(e) for e in entries)
        if fn is figures.kendall_tau:
            assert legend.get_texts()[0].get_text() == "dates dot-luong seed1 (60 steps)"
        else:  # the note says how to read the figure
            assert "steps" in legend.get_title().get_text()
        if fn is figures.erasure_fractions:
            counts = sorted(
                (t.get_window_extent(renderer) for t in fig.axes[1].texts), key=lambda b: b.y0
            )
            assert len(counts) == len(variants) * len(figures.RANKINGS)
            assert not any(a.overlaps(b) for a, b in zip(counts, counts[1:]))


def test_heatmap_labels_turn_when_they_would_overlap_and_blank_rows_are_explained():
    short = {"id": "short", "rows": ["a", "b", "<eos>"], "source": ["a", "b"]}
    short["attention"] = [[[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]]]
    subwords = ["r", "##e", "##d", "fi", "##re", "<eos>"]
    long = {"id": "long", "rows": ["r", "<eos>"], "source": subwords}
    long["attention"] = [[[1 / 6] * 6, [1 / 6] * 6]]
    long["gradient"] = [[0.0] * 6, [0.1, 0.2, 0.0, 0.0, 0.4, 0.0]]  # a vanished gradient row
    long["loo"] = [[0.1] * 6, [0.0, 0.2, 0.0, 0.0, 0.1, 0.0]]
    fig = figures.example_heatmaps([short, long], "m")
    axes = fig.axes
    rotations = {
        tuple(t.get_text() for t in ax.get_xticklabels()): {
            t.get_rotation() for t in ax.get_xticklabels()
        }
        for ax in axes
        if ax.get_xticklabels()
    }
    assert rotations[("a", "b")] == {0.0}  # fits upright
    assert rotations[tuple(subwords)] == {90.0}  # 6 labels of up to 5 characters: turned
    images = [ax.images[0].get_array() for ax in axes if ax.images]
    long_gradient = next(a for a in images if a.shape == (2, 6) and a[1].max() == 1.0)
    assert long_gradient.mask[0].all()  # all-zero row: blank, not a fake uniform or black row
    assert long_gradient[1].tolist() == [0.25, 0.5, 0.0, 0.0, 1.0, 0.0]
    legend = " ".join(t.get_text() for lg in fig.legends for t in lg.get_texts())
    assert "blank row" in legend and "every importance 0" in legend


def test_a_long_source_labels_every_column_without_overlap():
    """A 36-token source: every column labelled (seaborn-style thinning labelled 18 of 36), the
    figure widened so the vertical labels do not overlap."""
    source = list("segunda-feira, 12 de janeiro de 2024")  # 36 characters
    rec = {"id": "long", "rows": ["2", "<eos>"], "source": source}
    rec["attention"] = [[[1 / 36] * 36, [1 / 36] * 36]]
    fig = figures.example_heatmaps([rec], "m")
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == figures.visible_tokens(source)
    boxes = [t.get_window_extent() for t in ticks]
    assert all(a.x1 <= b.x0 + 0.5 for a, b in zip(boxes, boxes[1:]))  # side by side, no overlap


def test_invisible_marks_are_shown_as_code_points():
    assert figures.visible_tokens(["\u200f", "a b", "", "x\u00a0y", "\u200b"]) == [
        "⟨U+200F⟩",
        "a␣b",
        "∅",
        "x⟨U+00A0⟩y",
        "⟨U+200B⟩",
    ]


def test_erasure_intervals_match_seaborns_example_bootstrap():
    """The erasure bars' intervals (scipy, vectorised) against seaborn's own ``units`` bootstrap,
    the plain reference they replace: the same statistic, so the same interval up to Monte-Carlo
    error; and the drawn interval is the computed one."""
    import seaborn as sns
    from matplotlib import pyplot as plt

    rng = np.random.default_rng(1)
    n_ex = 40
    sizes = rng.integers(1, 12, n_ex)  # unequal steps per example: pooling, not a mean of means
    ex = np.repeat([f"ex{i}" for i in range(n_ex)], sizes)
    value = np.concatenate([rng.beta(1 + i % 5, 3, s) for i, s in enumerate(sizes)])
    rows = pd.DataFrame({"example_id": ex, "value": value})
    mean, low, high = figures.example_bootstrap_ci(rows)
    assert mean == pytest.approx(value.mean())
    fig, ax = plt.subplots()
    sns.barplot(
        data=rows, x="value", units="example_id", errorbar=("ci", 95), seed=0, n_boot=4000, ax=ax
    )
    (ref_low, ref_high) = sorted(ax.lines[0].get_xdata())
    plt.close(fig)
    width = ref_high - ref_low
    assert low == pytest.approx(ref_low, abs=0.1 * width)
    assert high == pytest.approx(ref_high, abs=0.1 * width)

    s = steps(n=40, variants=("copy additive-bahdanau",))
    s["erase_attn_desc_never_flipped"] = 0.0
    s["erase_random_never_flipped"] = 0.0
    fig = figures.erasure_fractions(s)
    drawn = sorted(
        tuple(sorted(line.get_xdata())) for line in fig.axes[1].lines if len(line.get_xdata()) == 2
    )
    for col in ("erase_attn_desc_frac_positions", "erase_random_frac_positions"):
        _, lo, hi = figures.example_bootstrap_ci(s.rename(columns={col: "value"}))
        assert any(a == pytest.approx(lo) and b == pytest.approx(hi) for a, b in drawn), col


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def test_row_labels_of_short_examples_do_not_overlap():
    """G2P general-luong's report: three short examples (2–4 decoder steps) drew each example's
    label ("blond — best by …") taller than its row of panels, into the next one ("stickle").
    Every row label and every row tick label of the first column keeps its own box."""
    records, shown = [], []
    for word, phones, rank in (
        ("blond", ["B", "L", "AA", "<eos>"], "best"),
        ("stickle", ["S", "<eos>"], "median"),
        ("ox", ["AA", "<eos>"], "worst"),
    ):
        n = len(word)
        rec = {"id": word, "rows": phones, "source": list(word), "prefix": "greedy"}
        rec["reference"] = phones[:-1]
        rec["attention"] = [[[1 / n] * n for _ in phones]]
        records.append(rec)
        shown.append({"rank": rank, "criterion": "tau_attn_loo", "value": 0.25})
    fig = figures.example_heatmaps(records, "g2p general-luong", shown=shown)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    first = [ax for ax in fig.axes if ax.get_ylabel() and ax.get_ylabel() != "attention weight"]
    assert [ax.get_ylabel().split(" ")[0].split("\n")[0] for ax in first] == [
        "blond",
        "stickle",
        "ox",
    ]
    labels = [ax.yaxis.label.get_window_extent(renderer) for ax in first]
    ticks = [
        t.get_window_extent(renderer) for ax in first for t in ax.get_yticklabels() if t.get_text()
    ]
    boxes = labels + ticks
    assert len(ticks) == 8
    clashes = [
        (i, j)
        for i in range(len(boxes))
        for j in range(i + 1, len(boxes))
        if _boxes_overlap(boxes[i], boxes[j])
    ]
    assert not clashes


def _na_marks(fig) -> dict[str, list[str]]:
    """model → the x tick labels (or y tick labels) nearest its "n/a" marks, read from the
    figure's artists."""
    out: dict[str, list[str]] = {}
    for ax in fig.axes:
        for t in ax.texts:
            if t.get_text() == "n/a" and (t.get_gid() or "").startswith("na:"):
                out.setdefault(t.get_gid()[3:], []).append(t)
    return out


def test_figures_mark_a_model_without_values_na_instead_of_dropping_it():
    """uniform's and none's τ groups, and none's permutation, were missing from the figures with
    nothing saying so: every model keeps its place, marked "n/a", and the legend says which."""
    none, uniform = "copy none-bahdanau", "copy uniform-bahdanau"
    s = steps(n=30, variants=("copy additive-bahdanau", uniform, none))
    for col in ("importance_tau_attn_grad", "importance_tau_attn_loo"):
        s.loc[s["variant"].isin([none, uniform]), col] = np.nan
    s.loc[s["variant"] == none, "permutation_median_tvd"] = np.nan
    for p in figures.TAU_P.values():
        s[p] = 0.01
    palette = figures.variant_palette(["copy additive-bahdanau", uniform, none])

    perm = figures.permutation_by_max_attention(s, palette)
    marks = _na_marks(perm)
    assert set(marks) == {none}
    bins = len(perm.axes[0].get_xticks())
    assert len(marks[none]) == bins  # its place in every bin
    legend = [t.get_text() for lg in perm.legends for t in lg.get_texts()]
    assert f"{none} (n/a)" in legend and uniform in legend
    assert perm.attnstudy_na == {none: []}

    tau = figures.kendall_tau(s, palette)
    ax = tau.axes[0]
    pairs = [t.get_text() for t in ax.get_xticklabels()]
    marks = _na_marks(tau)
    assert set(marks) == {none, uniform}
    for model in (none, uniform):  # one mark in each attention pair's group, none for grad–LOO
        at = sorted(
            pairs[round(t.get_position()[0])] for t in marks[model] if t.axes is tau.axes[0]
        )
        assert at == ["attention vs gradient", "attention vs leave-one-out"]
        # and in the right panel (share of significant steps): the same two places
        assert sum(t.axes is tau.axes[1] for t in marks[model]) == 2
    assert tau.attnstudy_na[none] == ["attention vs gradient", "attention vs leave-one-out"]
    legend = " ".join(t.get_text() for lg in tau.legends for t in lg.get_texts())
    assert uniform in legend and none in legend


def test_the_summary_plot_draws_the_no_attention_models_value_and_marks_the_rest_na():
    """The summary plot left out the no-attention model's τ gradient–LOO (0.28 in the table)."""
    none = "g2p none-bahdanau"
    rows = [
        {"group": "agrees", "label": "τ attention–LOO", "value": 0.3, "low": 0.2, "high": 0.4},
        {"group": "agrees", "label": "τ gradient–LOO", "value": 0.5, "low": 0.4, "high": 0.6},
    ]
    table = pd.DataFrame(
        [r | {"n": 50, "variant": "g2p additive-bahdanau", "scale": "τ"} for r in rows]
        + [
            {"group": "agrees", "label": "τ gradient–LOO", "value": 0.28, "low": 0.2}
            | {"high": 0.35, "n": 50, "variant": none, "scale": "τ"}
        ]
    )
    palette = figures.variant_palette(["g2p additive-bahdanau", none])
    fig = figures.estimates_plot(table, palette, models=["g2p additive-bahdanau", none])
    ax = fig.axes[0]
    colour = tuple(palette[none])
    points = [
        line.get_xdata()[0]
        for line in ax.lines
        if line.get_marker() == "o" and tuple(line.get_color()[:3]) == colour[:3]
    ]
    assert points == [0.28]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    (mark,) = _na_marks(fig)[none]
    assert labels[round(mark.get_position()[1])] == "τ attention–LOO"
    assert fig.attnstudy_na == {none: ["τ attention–LOO"]}
