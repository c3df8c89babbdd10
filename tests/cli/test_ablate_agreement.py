"""What ``attnstudy ablate`` says about agreement: attention's τ with every importance measure the
run has, from the catalogue's verdict roles, against the yardstick (the median τ between pairs of
importance measures other than attention). With integrated gradients and faithfulness it once
printed "τ attention–integrated gradients 0.458 [0.41, 0.499]" and below it "Agreement with other
importance measures was not measured"; a saliency τ was named but never read by the answer."""

from types import SimpleNamespace

import pytest

from attnstudy.report.ablate_summary import summary_lines
from attnstudy.tracking import Tag


def _metrics(**stats: tuple[float, float, float]) -> dict[str, float]:
    """The metrics an ablation run logs for ``ablation/<name>/<stat>`` (``name__stat``
    keywords): value, ``_ci_low``, ``_ci_high`` and ``_n_undefined``, with 64 decoder steps."""
    out = {"ablation/n_examples": 6.0}
    for key, (value, low, high) in stats.items():
        name, stat = key.split("__")
        k = f"ablation/{name}/{stat}"
        out |= {k: value, f"{k}_ci_low": low, f"{k}_ci_high": high, f"{k}_n_undefined": 0.0}
        out |= {f"ablation/{name}/n_steps": 64.0, f"ablation/{name}/n_skipped": 0.0}
    return out


class _Store:
    """A tracker holding one ablation run (what :func:`summary_lines` reads of it)."""

    def __init__(self, metrics: dict[str, float]):
        self.run = SimpleNamespace(
            metrics=metrics,
            params={"ablation.prefix": "greedy", "ablation.n_examples": "6"},
            tags={Tag.TASK: "copy", Tag.VARIANT: "additive-bahdanau", Tag.ATTENTION: "additive"},
            experiment_id="1",
        )

    def get_run(self, run_id: str):
        return self.run

    def artifact_location(self, experiment_id: str) -> str:
        return "/store/artifacts"


# the metrics of `ablate --ablations integrated_gradients,faithfulness` in the new user's trial
IG_AND_FAITHFULNESS = _metrics(
    integrated_gradients__tau_attn=(0.458, 0.41, 0.499),
    integrated_gradients__abs_delta=(0.0011, 0.0005, 0.0017),
    faithfulness__comprehensiveness_attention=(0.012, 0.008, 0.016),
    faithfulness__comprehensiveness_input_x_gradient=(0.0013, 0.0001, 0.0022),
    faithfulness__comprehensiveness_random=(0.0005, 0.0002, 0.0008),
)


def _agreement(lines: list[str]) -> str:
    start = lines.index(next(x for x in lines if x.startswith("verdict: ")))
    return next(x for x in lines[start + 1 :] if "importance" in x or "τ =" in x).strip()


def test_a_measured_tau_is_said_not_called_unmeasured():
    lines = summary_lines(_Store(IG_AND_FAITHFULNESS), "r" * 32)
    tau = next(x.split() for x in lines if x.strip().startswith("τ attention–integrated"))
    assert tau[3:6] == ["0.458", "[0.41,", "0.499]"], tau  # the table's line, as in the trial
    assert not any("Agreement with other importance measures was not measured" in x for x in lines)
    assert _agreement(lines) == (
        "Attention agrees with integrated gradients at τ = 0.46 [0.41, 0.5] (moderately); no "
        "pair of importance measures other than attention was measured (importance, "
        "attribution_agreement), so the answer has no yardstick."
    )
    # without a yardstick the answer is n/a
    assert "verdict: used n/a, unique n/a, agrees n/a, aligns n/a" in lines


@pytest.mark.parametrize(
    ("stats", "said"),
    [
        (  # saliency is read with the importance ablation's measures: below the yardstick
            {
                "importance__tau_attn_grad": (0.5, 0.45, 0.55),
                "importance__tau_attn_loo": (0.6, 0.55, 0.65),
                "importance__tau_grad_loo": (0.2, 0.17, 0.23),
                "saliency__tau_attn": (-0.3, -0.4, -0.2),
                "norm__tau_attn_loo": (0.6, 0.55, 0.65),  # importance's leave-one-out: once
            },
            "Attention agrees with gradient × input at τ = 0.5 [0.45, 0.55] (moderately), agrees "
            "with leave-one-out at τ = 0.6 [0.55, 0.65] (strongly) and disagrees with saliency at "
            "τ = -0.3 [-0.4, -0.2] (ranks positions in opposite order), against τ = 0.2 [0.17, "
            "0.23] between gradient and leave-one-out themselves: it agrees with them less than "
            "they agree with each other.",
        ),
        (  # norm and rollout are built from attention: named after the measures, not read
            {
                "norm__tau_attn_norm": (0.9, 0.85, 0.95),
                "norm__tau_attn_loo": (0.1, -0.05, 0.2),
                "rollout__tau_attn_rollout": (0.7, 0.6, 0.8),
                "rollout__tau_attn_loo": (0.1, -0.05, 0.2),
                "occlusion__tau_attn": (0.2, 0.1, 0.3),
            },
            "Attention agrees with occlusion at τ = 0.2 [0.1, 0.3] (weakly) and shows no "
            "evidence of agreement with leave-one-out at τ = 0.1 [-0.05, 0.2] (contains 0); no "
            "pair of importance measures other than attention was measured (importance, "
            "attribution_agreement), so the answer has no yardstick. Attention also agrees with "
            "norm at τ = 0.9 [0.85, 0.95] (strongly); agrees with rollout at τ = 0.7 [0.6, 0.8] "
            "(strongly).",
        ),
        (  # the attribution_agreement matrix's pairs: the median pair is the yardstick
            {
                "saliency__tau_attn": (0.5, 0.45, 0.55),
                "occlusion__tau_attn": (0.4, 0.35, 0.45),
                "attribution_agreement__tau_saliency_occlusion": (0.7, 0.65, 0.75),
                "attribution_agreement__tau_saliency_loo": (0.2, 0.15, 0.25),
                "attribution_agreement__tau_occlusion_loo": (0.45, 0.4, 0.5),
            },
            "Attention agrees with saliency at τ = 0.5 [0.45, 0.55] (moderately) and agrees "
            "with occlusion at τ = 0.4 [0.35, 0.45] (moderately), against τ = 0.45 [0.4, 0.5] "
            "between occlusion and leave-one-out, the median of the 3 pairs of importance "
            "measures other than attention: about as well as they agree with each other, or "
            "better.",
        ),
        (  # an even number of pairs: the lower middle one, a measured pair with its interval
            {
                "importance__tau_attn_grad": (0.1, 0.05, 0.15),
                "importance__tau_attn_loo": (0.5, 0.45, 0.55),
                "importance__tau_grad_loo": (0.2, 0.17, 0.23),
                "attribution_agreement__tau_saliency_occlusion": (0.7, 0.65, 0.75),
            },
            "Attention agrees with gradient × input at τ = 0.1 [0.05, 0.15] (weakly) and agrees "
            "with leave-one-out at τ = 0.5 [0.45, 0.55] (moderately), against τ = 0.2 [0.17, "
            "0.23] between gradient and leave-one-out, the median of the 2 pairs of importance "
            "measures other than attention: it agrees with them less than they agree with each "
            "other.",
        ),
        (
            {"permutation__flip_rate": (0.5, 0.4, 0.6)},
            "Agreement with other importance measures was not measured.",
        ),
    ],
)
def test_the_agreement_sentence_names_every_measured_tau(stats, said):
    assert _agreement(summary_lines(_Store(_metrics(**stats)), "r" * 32)) == said
