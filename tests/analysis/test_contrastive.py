"""Contrastive questions (Yin & Neubig 2022): the foil, the contrastive gradient as the difference of
two plain gradients, and interventions that move the argmax to the foil."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from analysis_testkit import (
    VOCAB,
    LinearReadout,
    call,
    hand_batch,
    make_examples,
    one_batch,
    sharpen,
    tiny_model,
)
from attnstudy.analysis.ablations.contrastive import contrastive_gradient, foils, to_foil
from attnstudy.analysis.attribution import gradient_scores
from attnstudy.analysis.batch import AblationContext
from attnstudy.analysis.catalogue import AblationConfig


def test_the_runner_up_is_the_most_probable_other_token_and_a_named_foil_is_checked():
    probs = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]])
    target = torch.tensor([[0, 2]])  # step 1: the emitted token is not the argmax
    assert foils(probs, target, "runner_up", VOCAB).tolist() == [[1, 1]]
    name = VOCAB.itos[2]
    assert foils(probs, target, name, VOCAB).tolist() == [[2, -1]]  # no foil where y_t is it
    with pytest.raises(ValueError, match="not a token of the target vocabulary"):
        foils(probs, target, "no-such-token", VOCAB)


def test_the_contrastive_gradient_is_the_difference_of_the_plain_gradients():
    model = sharpen(tiny_model())
    batch = one_batch(model, make_examples(), prefix="greedy")
    tr = batch.trace
    foil = torch.softmax(tr.logits, -1).scatter(-1, tr.tgt_out[..., None], -1.0).argmax(-1)
    got = contrastive_gradient(model, batch, foil)
    plain = gradient_scores(model, batch)["input_x_gradient"]
    of_foil = gradient_scores(model, dataclasses.replace(tr, tgt_out=foil))["input_x_gradient"]
    np.testing.assert_allclose(got.numpy(), (plain - of_foil).numpy(), atol=1e-5, equal_nan=True)


def test_each_step_reports_its_foil_and_moving_to_the_foil_is_a_flip():
    model = sharpen(tiny_model("multihead", "luong"), scale=6.0)  # its permutations flip
    batch = one_batch(model, make_examples(), prefix="greedy")
    cfg = AblationConfig(ablations=["contrastive"], contrastive={"n": 8})
    out = call("contrastive", model, batch, cfg)
    real = out[~out["contrastive_skipped"]]
    # the runner-up is the best other token: below y_t wherever y_t is the argmax (not at a
    # forced <eos> step of a prefix cut at the length limit)
    assert (real["contrastive_foil"] >= 0).all() and real["contrastive_log_odds"].notna().all()
    assert (real["contrastive_log_odds"] > 0).mean() > 0.5
    for name in ("uniform", "erase_max", "permutation"):
        to_foil, flip = real[f"contrastive_{name}_to_foil"], real[f"contrastive_{name}_flip"]
        assert (to_foil <= flip + 1e-12).all()  # moving to the foil changes the token
    # the permutations are the permutation ablation's (same seed and stream): the same flips
    perm = call("permutation", model, batch, AblationConfig(permutation={"n": 8}))
    merged = real.merge(perm, on=["example_id", "step"])
    np.testing.assert_allclose(
        merged["contrastive_permutation_flip"], merged["permutation_flip_rate"], atol=1e-12
    )
    assert merged["permutation_flip_rate"].sum() > 1  # not vacuous
    assert real["contrastive_tau_plain"].notna().any()


def test_uniform_and_erase_max_move_the_argmax_to_the_runner_up_by_construction():
    """Logits 10 · (α_t @ M): source 0 votes for token A, source 1 for B (weight 1.2), source 2 for
    C. α_0 = (0.8, 0.15, 0.05) emits A with runner-up B; uniform attention gives B 0.4 > A 0.33,
    erasing 0.8 leaves (0, 0.75, 0.25): B again. Both flip, and to the foil."""
    a, b, c = 4, 5, 6
    readout = torch.zeros(3, len(VOCAB))
    readout[0, a], readout[1, b], readout[2, c] = 1.0, 1.2, 1.0
    model = LinearReadout(readout)
    rows = torch.tensor([[0.8, 0.15, 0.05], [0.8, 0.15, 0.05]])
    batch = hand_batch(rows.view(1, 1, 2, 3), [3])
    tr = batch.trace
    base = torch.softmax(model.logits_given_attention(tr, tr.attention), -1)
    foil = foils(base, torch.full_like(tr.tgt_out, a), "runner_up", VOCAB)
    assert foil[0, 0] == b
    ok = torch.tensor([[True, False]])
    cols = to_foil(model, batch, base, foil, ok, 6, AblationContext())
    for name in ("uniform", "erase_max"):
        assert cols[f"contrastive_{name}_flip"][0, 0] == 1.0
        assert cols[f"contrastive_{name}_to_foil"][0, 0] == 1.0
        assert torch.isnan(cols[f"contrastive_{name}_to_foil"][0, 1])
    # a permutation flips exactly when it moves 0.8 off source 0; to B when it lands on source 1
    flip, foil_share = (
        cols["contrastive_permutation_flip"][0, 0],
        cols["contrastive_permutation_to_foil"][0, 0],
    )
    assert 0 <= foil_share <= flip <= 1 and flip > 0


# --- contrast sequences (one foil per step, as inseq's contrast_targets) ------------------------

CONTRAST_COLUMNS = [
    "contrastive_foil",
    "contrastive_log_odds",
    "contrastive_tau_attn",
    "contrastive_tau_plain",
    *(
        f"contrastive_{i}_{s}"
        for i in ("uniform", "erase_max", "permutation")
        for s in ("flip", "to_foil")
    ),
]


def _greedy(model, examples):
    batch = one_batch(model, examples, prefix="greedy")
    tr = batch.trace
    steps = tr.step_mask.sum(1).tolist()
    outputs = [tr.tgt_out[b, : steps[b]].tolist() for b in range(len(examples))]
    return batch, outputs


def _contrast(sequences: dict) -> AblationConfig:
    return AblationConfig(ablations=["contrastive"], contrastive={"n": 8, "contrast": sequences})


def test_a_contrast_sequence_of_the_runner_ups_reproduces_the_runner_up_results():
    """Each example's contrast = the runner-up of every step but the last, then <eos>: at those
    steps every column equals the runner-up run's; at the last step (the output's <eos>) the
    contrast's <eos> is the output's token: no foil, counted."""
    from attnstudy.analysis._chunks import base_probs

    from attnstudy.data.vocab import EOS_ID

    model = sharpen(tiny_model("multihead", "luong"), scale=6.0)
    examples = make_examples(12)
    batch, outputs = _greedy(model, examples)
    runner_up = foils(base_probs(model, batch.trace, 4096), batch.trace.tgt_out, "runner_up", VOCAB)
    clean = []  # examples whose runner-ups are target tokens (a contrast holds no special token)
    for b, ex in enumerate(examples):
        ids = runner_up[b, : len(outputs[b]) - 1].tolist()
        if outputs[b][-1] == EOS_ID and all(i >= 4 for i in ids):
            clean.append((ex, " ".join(VOCAB.itos[i] for i in ids)))
    assert len(clean) >= 4  # not vacuous
    kept = [ex for ex, _ in clean]
    batch, outputs = _greedy(model, kept)
    plain = call("contrastive", model, batch, AblationConfig(contrastive={"n": 8}))
    got = call("contrastive", model, batch, _contrast({ex.id: seq for ex, seq in clean}))
    last = got["step"] == got["example_id"].map({ex.id: len(o) - 1 for ex, o in zip(kept, outputs)})
    for col in CONTRAST_COLUMNS:
        np.testing.assert_allclose(got.loc[~last, col], plain.loc[~last, col], atol=1e-9)
    assert got.loc[~last, "contrastive_permutation_flip"].sum() > 1  # the permutations flip
    assert (got.loc[last, "contrastive_foil"] == -1).all()
    assert got.loc[last, "contrastive_log_odds"].isna().all()
    assert got["contrastive_foil_is_output"].tolist() == last.astype(float).tolist()
    assert got["contrastive_beyond_contrast"].sum() == 0
    assert got["contrastive_contrast_unused"].sum() == 0


def test_steps_past_the_shorter_sequence_and_equal_tokens_are_skipped_and_counted():
    """Output y (T steps, the last <eos>). A: contrast = y_0 alone → c = (y_0, <eos>): step 0
    equal (counted), step 1 asks 'why y_1 rather than stopping', steps 2…T−1 beyond the contrast
    (T − 2 counted). B: y then two more tokens → c = (y_0 … y_{T−2}, x, z, <eos>): T − 1 equal
    steps, the last step's foil x, 2 contrast tokens unused. C: y itself: every step equal, no
    value; the summary counts them all."""
    from attnstudy.analysis.suite import run_suite

    from attnstudy.data.vocab import EOS_ID

    model = sharpen(tiny_model("multihead", "luong"), scale=6.0)
    examples = [ex for ex in make_examples(12) if len(ex.src) >= 3][:3]
    batch, outputs = _greedy(model, examples)
    lengths = [len(o) for o in outputs]
    assert all(n >= 4 and o[-1] == EOS_ID for n, o in zip(lengths, outputs))
    words = [[VOCAB.itos[i] for i in o[:-1]] for o in outputs]
    x, z = VOCAB.itos[4], VOCAB.itos[5]
    sequences = {
        examples[0].id: words[0][0],
        examples[1].id: " ".join([*words[1], x, z]),
        examples[2].id: " ".join(words[2]),
    }
    out = call("contrastive", model, batch, _contrast(sequences))
    a, b, c = (out[out["example_id"] == ex.id].reset_index(drop=True) for ex in examples)
    ta, tb, tc = lengths
    assert a["contrastive_foil_is_output"].tolist() == [1.0] + [0.0] * (ta - 1)
    assert a["contrastive_beyond_contrast"].tolist() == [0.0, 0.0] + [1.0] * (ta - 2)
    assert a["contrastive_foil"].tolist() == [-1, EOS_ID] + [-1] * (ta - 2)
    assert a["contrastive_log_odds"].notna().tolist() == [False, True] + [False] * (ta - 2)
    assert b["contrastive_foil_is_output"].tolist() == [1.0] * (tb - 1) + [0.0]
    assert b["contrastive_foil"].tolist() == [-1] * (tb - 1) + [VOCAB.stoi[x]]
    assert b["contrastive_contrast_unused"].tolist() == [0.0] * (tb - 1) + [2.0]
    assert b["contrastive_beyond_contrast"].sum() == 0
    assert c["contrastive_foil_is_output"].tolist() == [1.0] * tc
    assert c[CONTRAST_COLUMNS[1:]].isna().all().all()
    # the summary: ablation/contrastive/<count>, and the means over the steps with a foil only
    res = run_suite(model, examples, VOCAB, VOCAB, _contrast(sequences), progress=False)
    s = res.summary
    assert s["ablation/contrastive/foil_is_output"] == 1 + (tb - 1) + tc
    assert s["ablation/contrastive/beyond_contrast"] == ta - 2
    assert s["ablation/contrastive/contrast_unused"] == 2
    assert s["ablation/contrastive/n_steps"] == ta + tb + tc
    assert s["ablation/contrastive/log_odds_n_undefined"] == ta + tb + tc - 2


def test_a_contrast_is_read_checked_and_keys_the_results(tmp_path):
    """A file of example_id<TAB>sequence lines: its digest is a resolved setting (a changed file
    changes the key; a digest that no longer matches is refused); no contrast leaves the settings
    as they were; unreadable or ambiguous files are refused in one line, naming file and line."""
    import pydantic
    from attnstudy.analysis.ablations.contrastive import contrast_by_id

    path = tmp_path / "contrast.tsv"
    path.write_text("t/0\ta b\nt/1\tc\n", encoding="utf-8")
    cfg = AblationConfig(ablations=["contrastive"], contrastive={"contrast": str(path)})
    params = cfg.params_for("contrastive")
    assert params.sequences() == {"t/0": "a b", "t/1": "c"}
    assert set(AblationConfig(ablations=["contrastive"]).resolved()["contrastive"]) == {"foil", "n"}
    sent = cfg.model_dump(mode="json")  # what a worker receives
    assert AblationConfig.model_validate(sent).params_for("contrastive") == params
    path.write_text("t/0\ta b\nt/1\td\n", encoding="utf-8")
    changed = AblationConfig(ablations=["contrastive"], contrastive={"contrast": str(path)})
    assert changed.resolved() != cfg.resolved()
    with pytest.raises(pydantic.ValidationError, match="has changed"):
        AblationConfig.model_validate(sent)
    # from Python: a list aligned with the examples, or a mapping; it keys by its digest
    examples = make_examples(2)
    mapping = contrast_by_id(examples, ["a b", "c"])
    py = AblationConfig(ablations=["contrastive"], contrastive={"contrast": mapping})
    assert py.params_for("contrastive").sequences() == {"t/0": "a b", "t/1": "c"}
    assert py.resolved()["contrastive"]["contrast"].startswith("python:")
    with pytest.raises(pydantic.ValidationError, match="cannot be read in another process"):
        AblationConfig.model_validate(py.model_dump(mode="json"))
    with pytest.raises(ValueError, match="1 contrast sequence"):
        contrast_by_id(examples, ["a b"])
    for text, message in [
        ("t/0\ta\n\nt/1\tb\n", ":2: blank line"),
        ("t/0\ta\tb\n", ":1: expected example_id<TAB>contrast sequence"),
        ("a b c\n", ":1: expected example_id<TAB>contrast sequence"),
        ("t/0\t \n", ":1: expected example_id<TAB>contrast sequence"),
        ("t/0\ta\nt/0\tb\n", ":2: example 't/0' has a contrast on line 1 already"),
        (b"t/0\t\xff\n", "not UTF-8"),
    ]:
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        with pytest.raises(pydantic.ValidationError, match=message):
            AblationConfig(ablations=["contrastive"], contrastive={"contrast": str(path)})
    with pytest.raises(pydantic.ValidationError, match="no such file"):
        AblationConfig(contrastive={"contrast": str(tmp_path / "none.tsv")})
    with pytest.raises(pydantic.ValidationError, match="either a foil"):
        AblationConfig(contrastive={"contrast": mapping, "foil": "a"})


def test_an_example_without_a_sequence_or_a_token_outside_the_vocabulary_is_refused():
    from attnstudy.data.types import DataError

    model = sharpen(tiny_model())
    examples = make_examples(3)
    batch = one_batch(model, examples, prefix="greedy")
    a, b = VOCAB.itos[4], VOCAB.itos[5]
    with pytest.raises(DataError, match="no sequence for example 't/2'"):
        call("contrastive", model, batch, _contrast({"t/0": a, "t/1": b}))
    with pytest.raises(DataError, match="has the token 'zz', not a token.*'chars' if the targets"):
        call("contrastive", model, batch, _contrast({"t/0": a, "t/1": b, "t/2": f"{a} zz"}))
    with pytest.raises(DataError, match="has the token '<eos>'"):
        call("contrastive", model, batch, _contrast({"t/0": a, "t/1": b, "t/2": f"{a} <eos>"}))
    # under contrast_tokenization = "chars" a sequence is split into characters
    chars = AblationConfig(
        ablations=["contrastive"],
        contrastive={
            "contrast": {"t/0": a + b, "t/1": b, "t/2": a},
            "contrast_tokenization": "chars",
        },
    )
    out = call("contrastive", model, batch, chars)
    first = out[out["example_id"] == "t/0"]
    assert (
        first["contrastive_foil_is_output"].iloc[0]
        + (first["contrastive_foil"].iloc[0] == VOCAB.stoi[a])
        == 1
    )


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    """A tiny Marian model whose tokenizer splits words into subwords ('dog' → d ##o ##g),
    untrained (its outputs are arbitrary, which this test does not need)."""
    pytest.importorskip("transformers")
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny

    return load_pretrained(
        build_tiny(tmp_path_factory.mktemp("hf") / "bpe", tokenizer="bpe", steps=0)
    )


def test_a_foil_word_that_the_tokenizer_splits_is_a_contrast_of_its_subwords(bpe_model):
    """'dog' is three subwords of the model's tokenizer: the contrast 'dog' gives steps 0–2 its
    subwords and step 3 <eos> (a step whose output is that token counted, not compared); as a
    named foil it is refused, naming the contrast."""
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.data.types import Example
    from attnstudy.models.hf import subword_examples

    model = bpe_model
    subwords = model.target_tokens("dog")
    assert len(subwords) == 3
    words = [
        Example(f"hf/{k}", tuple(s.split()), tuple(s.split()))
        for k, s in enumerate(["cat dog bird", "red fish", "old tree stone"])
    ]
    examples = subword_examples(model, words)
    vocab = model.vocab
    batch = next(prepare_batches(model, examples, vocab, vocab, "greedy", batch_size=3))
    cfg = _contrast({ex.id: "dog" for ex in examples})
    out = call("contrastive", model, batch, cfg)
    want = [vocab.stoi[t] for t in subwords] + [vocab.stoi["<eos>"]]
    for ex in examples:
        rows = out[out["example_id"] == ex.id].reset_index(drop=True)
        ys = batch.trace.tgt_out[examples.index(ex), : len(rows)].tolist()
        for t in range(min(4, len(rows))):
            same = ys[t] == want[t]
            assert rows["contrastive_foil"][t] == (-1 if same else want[t])
            assert rows["contrastive_foil_is_output"][t] == float(same)
        assert rows["contrastive_beyond_contrast"].sum() == max(0, len(rows) - 4)
        assert rows["contrastive_contrast_unused"].sum() == max(0, 4 - len(rows))
    assert set(out.loc[out["step"] < 3, "contrastive_foil"]) - {-1}  # subword foils compared
    assert out.loc[out["contrastive_foil"] >= 0, "contrastive_log_odds"].notna().all()
    with pytest.raises(ValueError, match="is a contrast sequence"):
        call("contrastive", model, batch, AblationConfig(contrastive={"foil": "dog"}))


def test_an_experiment_names_its_contrast_file_relative_to_itself_and_a_bad_one_exits_2(
    tmp_path, capfd
):
    """``[ablation.contrastive] contrast = "contrast.tsv"`` resolves against the experiment
    file's folder (as its data paths); an ambiguous file is refused before any training: one
    line, exit 2."""
    from cli_in_process import run_cli

    from attnstudy.cli import main as cli
    from attnstudy.experiment import load_experiment

    tiny = (Path(__file__).parents[2] / "experiments" / "tiny.toml").read_text(encoding="utf-8")
    folder = tmp_path / "exp"
    folder.mkdir()
    exp = folder / "tiny.toml"
    exp.write_text(
        tiny.replace(
            "[ablation.permutation]",
            '[ablation.contrastive]\ncontrast = "contrast.tsv"\n[ablation.permutation]',
        ),
        encoding="utf-8",
    )
    (folder / "contrast.tsv").write_text("copy/test/0\ta b\n", encoding="utf-8")
    other = tmp_path / "elsewhere"
    other.mkdir()
    cfg = load_experiment(exp)  # the working directory is not the experiment's folder
    params = cfg.ablation.params_for("contrastive")
    assert params.contrast == str(folder / "contrast.tsv")
    assert params.sequences() == {"copy/test/0": "a b"}
    (folder / "contrast.tsv").write_text("copy/test/0\ta b\ncopy/test/0\tc\n", encoding="utf-8")
    out = run_cli(capfd, ["train", str(exp)], cwd=other, env={"ATTNSTUDY_ROOT": str(other)})
    assert out.returncode == cli.EXIT_USAGE
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert "contrast.tsv:2: example 'copy/test/0' has a contrast on line 1 already" in out.stderr
