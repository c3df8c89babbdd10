"""The generated findings: known answers from constructed numbers, then from a constructed store
through the whole report (a uniform-attention model, a model whose permutation flip rate is 0.9,
a two-layer model, and a model without attention)."""

import re

import pytest
from attnstudy.analysis.catalogue import stat_keys, verdict_roles

from attnstudy.verdict.findings import (
    Drop,
    Thresholds,
    VerdictRole,
    VerdictThresholds,
    across_seeds,
    facts_from_metrics,
    layer_name,
    overall,
    steps_computed_on,
    verdict,
)


def metrics(**stats):
    """``ablation/<name>/<stat>`` = (value, low, high) → flat metrics with their intervals."""
    out = {"ablation/n_examples": 50.0}
    for key, (value, low, high) in stats.items():
        name, stat = key.split("__")
        k = f"ablation/{name}/{stat}"
        out[k], out[f"{k}_ci_low"], out[f"{k}_ci_high"] = value, low, high
        out[f"ablation/{name}/n_steps"] = 400.0
    return out


PARAMS = {"ablation.adversarial.eps_eval": "0.01", "ablation.permutation.n": "100"}
KEYS = stat_keys()
ROLES = verdict_roles()

UNIFORM = metrics(
    permutation__flip_rate=(0.0, 0.0, 0.0),
    uniform__flip_rate=(0.0, 0.0, 0.0),
    erase_max__flip_rate=(0.0, 0.0, 0.0),
    adversarial__found_rate=(0.02, 0.0, 0.05),
    adversarial__max_jsd=(0.01, 0.0, 0.02),
)
USED = metrics(
    permutation__flip_rate=(0.9, 0.86, 0.93),
    uniform__flip_rate=(0.8, 0.75, 0.85),
    erase_max__flip_rate=(0.7, 0.64, 0.76),
    permutation_global__exact_match_original=(0.8, 0.7, 0.9),
    permutation_global__exact_match_permuted=(0.1, 0.04, 0.18),
    permutation_global__exact_match_drop=(0.7, 0.6, 0.8),
    adversarial__found_rate=(0.95, 0.9, 0.98),
    adversarial__max_jsd=(0.4, 0.35, 0.45),
    importance__tau_attn_grad=(0.1, 0.02, 0.18),
    importance__tau_attn_loo=(0.12, 0.05, 0.2),
    importance__tau_grad_loo=(0.5, 0.42, 0.58),
    alignment__aer=(0.12, 0.08, 0.17),
    alignment__gold_mass=(0.8, 0.75, 0.85),
)


def test_uniform_attention_is_not_used_and_says_why():
    f = facts_from_metrics(
        "copy uniform-bahdanau", "uniform", UNIFORM, stat_keys=KEYS, roles=ROLES, params=PARAMS
    )
    v = verdict(f)
    assert v.used == "no" and v.unique == "yes"
    used = v.sentences[0]
    assert used.startswith("Attention is not used (n = 50 examples, 400 decoder steps)")
    assert "of P = 100 random permutations of the attention row, 0 % [0, 0] change" in used
    assert "fixed by construction" in used
    # the literature is cited once per report (findings.LITERATURE_CONTEXT), not per verdict
    assert "Jain & Wallace" not in v.text
    assert "ε = 0.01" in v.sentences[1]


def test_flip_rate_0_9_is_used_not_unique_weaker_agreement_aligned_with_literature():
    f = facts_from_metrics(
        "g2p additive-bahdanau", "additive", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS
    )
    v = verdict(f)
    assert (v.used, v.unique, v.agrees, v.aligns) == ("yes", "no", "weaker", "yes")
    used, unique, agrees, aligns = v.sentences
    assert used.startswith("Attention is used (n = 50 examples, 400 decoder steps)")
    assert "90 % [86, 93] change the predicted token" in used
    assert "uniform attention at 80 % [75, 85]" in used
    assert "erasing the largest weight at 70 % [64, 76]" in used
    # the measured complement of uniform flips, not set beside Moradi et al.'s word-level shares
    assert "the token stays the same at 20 % [15, 25] of steps." in used
    assert "68 %" not in v.text and "Moradi" not in v.text and "Vashishth" not in v.text
    assert (
        "lowers exact match from 0.8 [0.7, 0.9] to 0.1 [0.04, 0.18] (drop 0.7 [0.6, 0.8])" in used
    )
    assert "for 95 % [90, 98] of decoder steps" in unique and "0.4 [0.35, 0.45] nats" in unique
    assert unique.startswith("It is not a unique explanation")
    assert "τ = 0.1 [0.02, 0.18] (weakly)" in agrees
    assert "less than they agree with each other" in agrees
    assert aligns.startswith(
        "It aligns with the gold alignment: its argmax has AER 0.12 [0.08, 0.17]"
    )
    # no number in the text that is not measured (the literature's are cited once per report)
    allowed = {"50", "400", "100", "0.01", "0.693", "0", "2"}  # ln 2 ≈ 0.693
    numbers = set(re.findall(r"\d+(?:\.\d+)?", v.text))
    measured = {str(x) for x in (90, 86, 93, 80, 75, 85, 70, 64, 76, 20, 15, 25, 95, 98)} | {
        "0.8",
        "0.7",
        "0.9",
        "0.1",
        "0.04",
        "0.18",
        "0.6",
        "0.4",
        "0.35",
        "0.45",
        "0.02",
        "0.12",
        "0.05",
        "0.2",
        "0.5",
        "0.42",
        "0.58",
        "0.08",
        "0.17",
        "0.75",
        "0.85",
    }
    assert numbers <= allowed | measured, numbers - allowed - measured


def test_thresholds_are_configurable_and_change_the_answer():
    f = facts_from_metrics("m", "additive", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS)
    strict = VerdictThresholds(used_flip=0.95, unused_flip=0.5)
    v = verdict(f, strict)
    assert v.used == "unclear"
    assert (
        "neither rule decides: the upper bound 93 % is not below the 50 % threshold for "
        "'not used', the lower bound 86 % is below the 95 % threshold for 'used'."
    ) in v.sentences[0]
    assert verdict(f, VerdictThresholds(align_aer=0.1)).aligns == "partly"
    with pytest.raises(ValueError):
        VerdictThresholds(used_flip=1.5)


@pytest.mark.parametrize(
    ("attn_grad", "attn_loo", "grad_loo", "answer"),
    [
        # a user's untrained tiny model: τ ≈ 0 against a baseline of τ ≈ 0 was "agrees: yes"
        ((-0.05, -0.1, 0.0), (-0.16, -0.2, -0.12), (-0.09, -0.13, -0.05), "unclear"),
        ((0.15, 0.1, 0.2), (0.2, 0.15, 0.25), (0.183, 0.171, 0.196), "unclear"),
        ((0.1, 0.05, 0.15), (0.1, 0.05, 0.15), (0.2, 0.17, 0.23), "weaker"),  # below it: weaker
        ((0.5, 0.45, 0.55), (0.6, 0.55, 0.65), (0.2, 0.17, 0.23), "yes"),  # τ ≥ 0.3 both
        ((0.5, 0.45, 0.55), (0.45, 0.4, 0.5), (0.5, 0.42, 0.58), "yes"),  # a strong baseline
    ],
)
def test_agreement_against_a_weak_baseline_is_unclear(attn_grad, attn_loo, grad_loo, answer):
    m = metrics(
        importance__tau_attn_grad=attn_grad,
        importance__tau_attn_loo=attn_loo,
        importance__tau_grad_loo=grad_loo,
    )
    v = verdict(facts_from_metrics("m", "additive", m, stat_keys=KEYS, roles=ROLES, params=PARAMS))
    assert v.agrees == answer
    said = "gradient and leave-one-out hardly agree with each other (τ below 0.3), so the"
    assert (said in v.text) == (answer == "unclear")


def test_an_interval_straddling_a_threshold_is_unclear_not_rounded():
    m = metrics(permutation__flip_rate=(0.12, 0.05, 0.2))
    assert (
        verdict(
            facts_from_metrics("m", "additive", m, stat_keys=KEYS, roles=ROLES, params=PARAMS)
        ).used
        == "unclear"
    )


def test_overall_paragraph_counts_models():
    fu = facts_from_metrics("u", "uniform", UNIFORM, stat_keys=KEYS, roles=ROLES, params=PARAMS)
    fa = facts_from_metrics("a", "additive", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS)
    fn = facts_from_metrics("n", "none", {}, stat_keys=KEYS, roles=ROLES, params=PARAMS)
    vs = [verdict(f) for f in (fu, fa, fn)]
    assert vs[2].sentences[0].startswith("No attention")
    text = overall(vs, [fu, fa, fn])
    assert text.startswith("Of the 2 models with attention, 1 uses it")
    assert "at 90 % of their decoder steps" in text
    assert "1 does not use it" in text
    assert "Across seeds" not in text  # no configuration list: nothing said of seeds


def test_overall_points_to_the_per_model_findings_that_follow_it():
    """The paragraph opens the findings, before the per-model sections: it said "reported per
    model above"."""
    fa = facts_from_metrics("a", "additive", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS)
    text = overall([verdict(fa)], [fa])
    assert "it is not the one explanation" in text
    assert text.endswith("reported per model below.")
    assert "above" not in text


def test_overall_says_where_the_seeds_of_a_configuration_disagree():
    # additive: two seeds, both used; general: seed 1 used, seed 2 with an interval straddling the
    # threshold (unclear); none is not tested and its seeds are not counted
    unclear = metrics(permutation__flip_rate=(0.12, 0.05, 0.2))
    facts = [
        facts_from_metrics("a", "additive", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS),
        facts_from_metrics("a seed2", "additive", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS),
        facts_from_metrics("g", "general", USED, stat_keys=KEYS, roles=ROLES, params=PARAMS),
        facts_from_metrics(
            "g seed2", "general", unclear, stat_keys=KEYS, roles=ROLES, params=PARAMS
        ),
        facts_from_metrics("n", "none", {}, stat_keys=KEYS, roles=ROLES, params=PARAMS),
        facts_from_metrics("n seed2", "none", {}, stat_keys=KEYS, roles=ROLES, params=PARAMS),
    ]
    vs = [verdict(f) for f in facts]
    assert [v.used for v in vs[:4]] == ["yes", "yes", "yes", "unclear"]
    configs = ["dates a", "dates a", "dates g", "dates g", "dates n", "dates n"]
    text = overall(vs, facts, configs)
    # each seed is a model; the configurations are counted beside them (none's are not tested)
    assert text.startswith("Of the 4 models with attention (2 configurations, 2 seeds each), 3 use")
    tail = text.split(" Across seeds: ", 1)[1]
    assert tail.startswith("of the 2 configurations trained with more than one seed, every seed ")
    assert (
        "gets the same answers for 1; dates g's seeds differ on whether it is used (yes, " in tail
    )
    assert "(yes, unclear)" in tail and "dates a's" not in tail and "dates n" not in tail
    # every seed alike
    same = overall(vs[:2], facts[:2], configs[:2])
    # plain text, no Markdown emphasis: the HTML report shows it as written
    assert "it is not the one explanation — other, very different weights" in same
    assert "*" not in same
    assert same.endswith(
        "Across seeds: of the 1 configuration trained with more than one seed, every seed gets "
        "the same answers for it."
    )
    assert same.startswith("Of the 2 models with attention (1 configuration, 2 seeds each), 2 ")
    # one seed per configuration: the models are the configurations, nothing more is said
    single = overall([vs[0], vs[2]], [facts[0], facts[2]], ["dates a", "dates g"])
    assert single.startswith("Of the 2 models with attention, 2 use it")
    with pytest.raises(ValueError, match="2 verdicts but 1 configurations"):
        across_seeds(vs[:2], configs[:1])
    with pytest.raises(ValueError, match="6 models but 5 configurations"):
        overall(vs, facts, configs[:5])


# ----------------------------------------------------------------------------- a constructed store


def _steps(layers: dict[int, float], n_examples: int = 12, n_steps: int = 5):
    """A per-step table whose permutation flip rate is exactly ``layers[l]`` at every step of layer l."""
    import pandas as pd

    rows = []
    for layer, flip in layers.items():
        for i in range(n_examples):
            for t in range(n_steps):
                rows.append(
                    {
                        "example_id": f"ex{i}",
                        "prefix": "greedy",
                        "layer": layer,
                        "head": -1,
                        "step": t,
                        "max_attention": 0.5,
                        "permutation_flip_rate": flip,
                        "permutation_median_tvd": flip / 2,
                        "permutation_skipped": False,
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def constructed_report(tmp_path_factory):
    """A study of four models written straight into a fresh store, and its built report."""
    from attnstudy.report import build_report
    from attnstudy.tracking import Artifact, Kind, Tag, Tracker

    root = tmp_path_factory.mktemp("findings")
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}")
    exp = tracker.experiment_id("constructed")
    study = tracker.start_run(exp, "study", {Tag.KIND: Kind.STUDY, Tag.EXPERIMENT: "constructed"})
    layered = metrics(permutation__flip_rate=(0.9, 0.9, 0.9))
    # the suite logs each layer's global permutation (a per-example ablation) under its layer
    glob = metrics(
        permutation_global__exact_match_original=(0.6, 0.5, 0.7),
        permutation_global__exact_match_permuted=(0.1, 0.05, 0.15),
        permutation_global__exact_match_drop=(0.5, 0.4, 0.6),
    )
    layered |= {
        k.replace("ablation/", "ablation/layer1/", 1): v
        for k, v in glob.items()
        if k.startswith("ablation/permutation_global/")
    }
    models = [  # (variant, seed, attention, ablation metrics, per-step table)
        ("uniform-bahdanau", "1", "uniform", UNIFORM, None),
        ("additive-bahdanau", "1", "additive", USED, None),
        ("additive-bahdanau", "2", "additive", USED, None),
        ("transformer-L2H1", "1", "multihead", layered, _steps({0: 0.0, 1: 0.9})),
        ("none-bahdanau", "1", "none", {}, None),
    ]
    model_ids, ablation_ids = [], []
    for variant, seed, attention, m, steps in models:
        tags = {
            Tag.KIND: Kind.MODEL,
            Tag.TASK: "copy",
            Tag.ATTENTION: attention,
            Tag.FLOW: "bahdanau",
            Tag.VARIANT: variant,
            Tag.SEED: seed,
        }
        run = tracker.start_run(exp, f"{variant}/seed{seed}", tags, study)
        tracker.log_metrics(run, {"test/exact_match": 0.5})
        tracker.end_run(run)
        abl = tracker.start_run(
            exp,
            f"{variant}/seed{seed}/ablations",
            {Tag.KIND: Kind.ABLATION, Tag.SOURCE_RUN_ID: run},
            run,
        )
        ran = '["permutation", "permutation_global"]' if steps is not None else '["permutation"]'
        tracker.log_params(abl, PARAMS | {"ablation.prefix": "greedy", "ablation.ablations": ran})
        if attention == "none":
            tracker.set_tags(
                abl, {f"{Tag.SKIPPED_PREFIX}permutation": "the model has no attention"}
            )
        tracker.log_metrics(abl, m)
        if steps is not None:
            tracker.log_table(abl, steps, Artifact.STEPS)
        tracker.end_run(abl)
        model_ids.append(run)
        ablation_ids.append(abl)
    tracker.set_tags(
        study,
        {Tag.MODEL_RUN_IDS: ",".join(model_ids), Tag.ABLATION_RUN_IDS: ",".join(ablation_ids)},
    )
    tracker.end_run(study)
    html = build_report(tracker, study, root / "report")
    return html.read_text(encoding="utf-8"), (root / "report" / "report.md").read_text("utf-8")


def _section(md: str, heading: str) -> str:
    """A model's section: its heading names the model, then its experiment and data set."""
    start = md.index(f"### {heading} (experiment ")
    end = md.find("\n#", start + 4)
    return md[start:end]


def test_constructed_store_report_says_the_expected_thing(constructed_report):
    html, md = constructed_report
    findings = md[md.index("## Findings") : md.index("## How this was measured")]
    uniform = _section(findings, "copy uniform-bahdanau")
    assert "`used: no`" in uniform and "Attention is not used" in uniform
    assert "fixed by construction" in uniform
    used = _section(findings, "copy additive-bahdanau")
    assert "`used: yes`" in used and "90 % [86, 93] change the predicted token" in used
    # the literature once, after the verdicts; Moradi's word-level shares beside no flip rate
    assert "68 %" not in used and "Vashishth" not in used
    assert findings.count("68 % of function words and 21 % of content words") == 1
    assert findings.count("Vashishth et al. (2019)") == 1
    none = _section(findings, "copy none-bahdanau")
    assert "No attention: this model is the bottleneck baseline" in none
    # the two-layer model: a verdict per layer and for the layer mean
    layered = findings[findings.index("### copy transformer-L2H1") :]
    assert "layer 1" in layered and "layer 2" in layered and "layer mean" in layered
    per_layer = {
        name: layered[layered.index(name) : layered.index(name) + 400]
        for name in ("layer 1", "layer 2", "layer mean")
    }
    assert "Attention is not used" in per_layer["layer 1"]
    assert "0 % [0, 0] change" in per_layer["layer 1"]
    assert "Attention is used" in per_layer["layer 2"]
    assert "90 % [90, 90] change" in per_layer["layer 2"]
    assert "45 % [45, 45] change" in per_layer["layer mean"]
    # the layer's own global permutation, where the suite measured it per layer
    layer1 = layered[layered.index("layer 2") : layered.index("layer mean")]
    assert (
        "lowers exact match from 0.6 [0.5, 0.7] to 0.1 [0.05, 0.15] (drop 0.5 [0.4, 0.6])" in layer1
    )
    assert "free-running" not in layered[layered.index("layer 1") : layered.index("layer 2")]
    # the table: the layer's own global permutation; the layer mean has none, and says why
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in md.splitlines()
        if line.startswith("| copy transformer-L2H1")
    }
    assert "0.5 [0.4, 0.6]" in rows["copy transformer-L2H1 · layer 2"]
    assert "per layer only" in rows["copy transformer-L2H1 · layer mean"]
    overall = findings.split("\n\n")[1]
    # additive-bahdanau has two seeds, the other two configurations with attention one each
    assert overall.startswith(
        "**Of the 4 models with attention (3 configurations, 1–2 seeds each), 3 use it"
    )
    # additive-bahdanau's two seeds get the same answers; the others have one seed
    assert "Across seeds: of the 1 configuration trained with more than one seed, every seed " in (
        overall
    )
    assert "copy additive-bahdanau seed2" in findings
    assert "- Seeds: 1, 2." in md and "One seed per configuration" not in md
    # the HTML says the same, from the same data
    assert "fixed by construction" in html and html.count("68 % of function words") == 1
    assert html.count('class="verdict"') == 5  # one per model
    assert html.count('class="verdict layer"') == 3  # layer 1, layer 2, layer mean


def test_steps_counted_are_those_each_statistic_was_computed_on():
    """An own-data model with one-token sources: 20 steps analysed, 8 skipped by every
    intervention; the verdict and ModelFacts.stat_steps said 20 where the statistics rest on 12
    (gold mass: 99 reference steps, 20 of them <eos> where it is undefined)."""
    m = metrics(
        permutation__flip_rate=(0.5, 0.4, 0.6),
        alignment__gold_mass=(0.8, 0.75, 0.85),
        alignment__aer=(0.2, 0.1, 0.3),
    )
    m |= {"ablation/permutation/n_steps": 20.0, "ablation/permutation/n_skipped": 8.0}
    m |= {"ablation/alignment/n_steps": 99.0, "ablation/alignment/n_skipped": 0.0}
    m |= {"ablation/alignment/gold_mass_n_undefined": 20.0}
    f = facts_from_metrics("m", "additive", m, stat_keys=KEYS, roles=ROLES, params=PARAMS)
    assert steps_computed_on(m, "ablation/permutation/flip_rate") == 12
    assert f.stat_steps == {
        "ablation/permutation/flip_rate": 12,
        "ablation/alignment/gold_mass": 79,
        "ablation/alignment/aer": 99,
    }
    assert "(n = 50 examples, 12 decoder steps)" in verdict(f).sentences[0]


@pytest.mark.parametrize(
    ("tau", "said"),
    [
        (
            (-0.29, -0.44, -0.15),
            "disagrees with gradient × input at τ = -0.29 [-0.44, -0.15] "
            "(ranks positions in opposite order)",
        ),
        (
            (0.06, -0.03, 0.2),
            "shows no evidence of agreement with gradient × input at "
            "τ = 0.06 [-0.03, 0.2] (contains 0)",
        ),
        ((0.1, 0.02, 0.18), "agrees with gradient × input at τ = 0.1 [0.02, 0.18] (weakly)"),
    ],
)
def test_a_negative_tau_is_disagreement_not_weak_agreement(tau, said):
    m = metrics(importance__tau_attn_grad=tau)
    v = verdict(facts_from_metrics("m", "additive", m, stat_keys=KEYS, roles=ROLES, params=PARAMS))
    agrees = next(s for s in v.sentences if "gradient × input" in s)
    assert agrees.startswith("Attention " + said), agrees


def test_an_unclear_use_names_the_bound_the_rule_read_at_its_precision():
    """1 % [0, 2] "between the thresholds 0.02 and 0.1": the rule read the upper bound 0.0237."""
    m = metrics(permutation__flip_rate=(0.012, 0.0, 0.0237))
    v = verdict(facts_from_metrics("m", "additive", m, stat_keys=KEYS, roles=ROLES, params=PARAMS))
    assert v.used == "unclear"
    assert "1 % [0, 2] change the predicted token" in v.sentences[0]
    assert (
        "neither rule decides: the upper bound 2.4 % is not below the 2 % threshold for "
        "'not used', the lower bound 0 % is below the 10 % threshold for 'used'."
    ) in v.sentences[0]
    assert "between the thresholds" not in v.text


def test_layers_are_named_1_based():
    assert layer_name(1, 2) == "2 of 2 (the last)"
    assert layer_name(0, 2) == "1 of 2" and layer_name(0) == "1"


def test_facts_with_statistics_but_no_verdict_roles_are_refused():
    """Without the catalogue's roles every question would read "not measured" beside measured
    numbers: refused, naming what to pass."""
    f = facts_from_metrics("m", "additive", USED, stat_keys=KEYS, params=PARAMS)
    with pytest.raises(ValueError, match="verdict_roles"):
        verdict(f)


def test_the_verdict_reads_the_statistics_the_catalogue_gives_roles():
    """The roles, not names in verdict/findings.py: the same numbers under a role-less key say
    nothing,
    and a catalogue without the uniform statistic's role leaves it out of the used sentence."""
    roles = dict(ROLES)
    del roles["ablation/uniform/flip_rate"]
    f = facts_from_metrics("m", "additive", USED, stat_keys=KEYS, roles=roles, params=PARAMS)
    used = verdict(f).sentences[0]
    assert "uniform attention at" not in used and "Under uniform attention" not in used
    assert "erasing the largest weight at 70 % [64, 76]" in used


@pytest.mark.parametrize(
    ("role", "match"),
    [
        (dict(question="used", role="yardstick"), "takes measure, beside"),
        (dict(question="used", phrase="{fmt}"), "Thresholds"),
        (dict(question="agrees"), "measure=…"),
        (dict(question="mine", role="measure"), "takes note"),
        (dict(question="used", role="measure", rule=Drop("a", "b"), phrase="x"), "Thresholds"),
    ],
)
def test_a_role_its_question_cannot_read_is_refused(role, match):
    with pytest.raises(ValueError, match=match):
        VerdictRole(**role)


def test_a_statistic_with_thresholds_needs_a_direction():
    from attnstudy.analysis.catalogue import AblationSpecError, Stat

    role = VerdictRole("aligns", rule=Thresholds(0.5, 0.9), phrase="{fmt}")
    with pytest.raises(AblationSpecError, match="direction"):
        Stat("x_y", verdict=role)
    assert Stat("x_y", direction="lower", verdict=role).verdict is role


def test_a_measure_with_numeric_thresholds_states_them_and_decides():
    """An entry's own thresholds (numbers, not [report.verdict] keys) decide its question and are
    said in the sentence: the report's thresholds table lists only the configurable ones."""
    role = VerdictRole(
        "aligns",
        rule=Thresholds(0.5, 0.9),
        phrase="its attention has normalised entropy {fmt}",
        direction="lower",
    )
    key = "ablation/entropy/normalised"
    m = {key: 0.95, f"{key}_ci_low": 0.93, f"{key}_ci_high": 0.97}
    v = verdict(facts_from_metrics("m", "additive", m, stat_keys=[key], roles={key: role}))
    assert v.aligns == "no"
    assert v.sentences[-1] == (
        "It does not align with the gold alignment: its attention has normalised entropy 0.95 "
        "[0.93, 0.97] ('aligns' where its upper bound < 0.5, 'does not align' where its lower "
        "bound ≥ 0.9)."
    )
