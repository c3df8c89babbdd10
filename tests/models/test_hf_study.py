"""A pretrained Hugging Face model as one more variant of a study (``[model] source =
"hf:FOLDER"``) and ``attnstudy ablate hf:FOLDER --data EXPERIMENT.toml``: evaluated against
transformers' own ``generate``, ablated with the same pages as a trained model, reported beside
it, reused while its files are unchanged."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prerequisites import require  # noqa: E402

require(
    importlib.util.find_spec("transformers") is not None,
    "transformers is not installed (pip install -e '.[hf]')",
    module_level=True,
)

pytestmark = pytest.mark.slow

from attnstudy.models.hf_tiny import build_tiny, copy_pairs  # noqa: E402


@pytest.fixture(scope="module")
def tiny_marian(tmp_path_factory):
    return build_tiny(
        tmp_path_factory.mktemp("hf") / "tiny-marian", family="marian", tokenizer="bpe", steps=400
    )


@pytest.fixture
def root(fresh_root):
    return fresh_root


def _experiment(tmp_path: Path, folder: Path, rnn: bool = True) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for name, n, seed in (("train", 60, 1), ("dev", 10, 2), ("test", 12, 3)):
        lines = [
            f"{s}\t{s}\t" + " ".join(f"{i}-{i}" for i in range(len(s.split())))
            for s in copy_pairs(n, seed)
        ]
        (data / f"{name}.tsv").write_text("\n".join(lines) + "\n")
    models = '[[models]]\nmodel = { attention = "additive" }\n' if rnn else ""
    # relative to the experiment file
    models += (
        f'[[models]]\nmodel = {{ source = "hf:{Path("..") / folder.parent.name / folder.name}" }}\n'
    )
    toml = tmp_path / "exp" / "hf.toml"
    toml.parent.mkdir(exist_ok=True)
    shutil.copytree(folder, tmp_path / folder.parent.name / folder.name, dirs_exist_ok=True)
    toml.write_text(
        f"""
[experiment]
name = "hf-study"
[data]
task = "tsv"
train_path = "{data / "train.tsv"}"
dev_path = "{data / "dev.tsv"}"
test_path = "{data / "test.tsv"}"
[model]
embedding_dim = 8
encoder_hidden = 8
decoder_hidden = 16
attention_dim = 8
[training]
epochs = 1
[ablation]
n_examples = 4
ablations = ["permutation", "uniform", "alignment"]
bootstrap_resamples = 50
layers = "each"
[ablation.permutation]
n = 10
{models}"""
    )
    return toml


def _generate_exact_match(folder: Path, test: Path) -> float:
    """Greedy exact match computed with transformers alone (``generate``, then the tokenizer's
    decode), the reference for the model run's ``test/exact_match``."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True).eval()
    rows = [line.split("\t")[:2] for line in test.read_text().splitlines()]
    hits = 0
    for src, tgt in rows:
        enc = tok(src, return_tensors="pt")
        n = enc.input_ids.size(1)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=False,
                num_beams=1,
                max_new_tokens=2 * n + 2,  # training.max_decode_factor 2: ⌈2 T_x⌉ + 2 steps
                bad_words_ids=[[model.config.pad_token_id]],
            )
        hits += tok.decode(out[0], skip_special_tokens=True).split() == tgt.split()
    return hits / len(rows)


def _reference_aer(folder: Path, test: Path, n: int) -> dict[int, float]:
    """Standard AER (Och & Ney 2003, eq. 7) of each decoder layer's head-mean cross-attention
    over the first ``n`` test examples, computed with transformers alone: teacher forcing on the
    reference, attention summed over a source word's subwords and averaged over a target word's
    subwords (Clark et al. 2019, §4.1), one link per target word at the argmax source word, and
    the corpus counts over all examples. Every gold link is sure (``i-i``)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(
        folder, local_files_only=True, attn_implementation="eager"
    ).eval()
    counts: dict[int, list[int]] = {}  # layer → [|A|, |A∩S|, |S|]
    for line in test.read_text().splitlines()[:n]:
        src, tgt, links = line.split("\t")
        words_x, words_y = src.split(), tgt.split()
        sure = {tuple(int(i) for i in link.split("-")) for link in links.split()}
        enc = tok(src, return_tensors="pt", return_offsets_mapping=True)
        lab = tok(text_target=tgt, return_offsets_mapping=True)
        start = model.config.decoder_start_token_id
        dec = torch.tensor([[start] + lab["input_ids"][:-1]])  # the prefix; the last row is <eos>'s
        with torch.no_grad():
            out = model(
                input_ids=enc.input_ids,
                attention_mask=enc.attention_mask,
                decoder_input_ids=dec,
                output_attentions=True,
            )

        def word_of(offsets, words):
            starts = [sum(len(w) + 1 for w in words[:k]) for k in range(len(words))]
            return [
                -1 if e <= s else max(k for k, st in enumerate(starts) if st <= s)
                for s, e in offsets
            ]

        wx = word_of(enc.offset_mapping[0].tolist(), words_x)
        wy = word_of(lab["offset_mapping"][:-1], words_y)
        for layer, att in enumerate(out.cross_attentions):
            rows = att[0].mean(0)  # (T_y, T_x), head mean
            c = counts.setdefault(layer, [0, 0, 0])
            for j in range(len(words_y)):
                sub_rows = [t for t, w in enumerate(wy) if w == j]
                scores = [
                    float(sum(rows[t, i] for t in sub_rows for i, w in enumerate(wx) if w == k))
                    / len(sub_rows)
                    for k in range(len(words_x))
                ]
                best = [k for k, v in enumerate(scores) if v == max(scores)]
                if len(best) == 1:  # a tie gives no link
                    c[0] += 1
                    c[1] += (best[0], j) in sure
            c[2] += len(sure)
    return {layer: 1 - 2 * hit / (a + s) for layer, (a, hit, s) in counts.items()}


def test_a_study_evaluates_ablates_and_reports_a_pretrained_variant(tmp_path, root, tiny_marian):
    import mlflow
    import pandas as pd

    from attnstudy import api
    from attnstudy.data.hf_folder import folder_digests
    from attnstudy.experiment import load_experiment

    toml = _experiment(tmp_path, tiny_marian)
    cfg = load_experiment(toml)
    out = api.run(cfg, progress=False)
    rnn, hf = out.models
    assert (rnn.reused, hf.reused) == (False, False)
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    run = client.get_run(hf.run_id)
    tags, metrics = run.data.tags, run.data.metrics
    folder = tmp_path / tiny_marian.parent.name / tiny_marian.name
    assert tags["architecture"] == "hf:marian" and tags["variant"] == "hf-tiny-marian"
    assert (tags["layers"], tags["heads"]) == ("2", "2")
    assert tags["hf.folder"] == str(folder.resolve())
    assert json.loads(tags["hf.digest"]) == folder_digests(folder)
    assert tags["study_id"] == out.study_run_id
    # the evaluation is transformers' own greedy decoding, scored on the data's words
    expected = _generate_exact_match(folder, tmp_path / "data" / "test.tsv")
    assert metrics["test/n"] == 12
    assert metrics["test/exact_match"] == pytest.approx(expected, abs=1e-9)
    assert metrics["test/exact_match"] > 0.5  # the fine-tuned copy model copies
    abl = client.get_run(out.ablations[hf.run_id])
    assert abl.data.tags["mlflow.parentRunId"] == hf.run_id
    assert abl.data.tags["architecture"] == "hf:marian" and abl.data.tags["layers"] == "2"
    # AER per layer as transformers' own cross-attention gives it (the analysed layer is the last)
    aer = _reference_aer(folder, tmp_path / "data" / "test.tsv", 4)
    for layer in (0, 1):
        stored = abl.data.metrics[f"ablation/layer{layer}/alignment/aer"]
        assert stored == pytest.approx(aer[layer], abs=1e-6)
    assert abl.data.metrics["ablation/alignment/aer"] == pytest.approx(aer[1], abs=1e-6)
    paths = {f.path for f in client.list_artifacts(abl.info.run_id, "ablations")}
    assert {"ablations/steps.parquet", "ablations/browser.html"} <= paths
    html = Path(out.report).read_text(encoding="utf-8")
    assert "tsv hf-tiny-marian" in html and "tsv additive-bahdanau" in html
    # per layer, as for a Transformer: both decoder layers and their mean
    for layer in ("layer 1", "layer 2", "layer mean"):  # 1-based, as people read them
        assert f"tsv hf-tiny-marian · {layer}" in html
    steps = pd.read_parquet(client.download_artifacts(abl.info.run_id, "ablations/steps.parquet"))
    assert sorted(steps["layer"].dropna().unique().tolist()) == [0, 1]
    em = f"{metrics['test/exact_match']:.3g}"
    assert f"<td>{em} [" in html or f">{em} [" in html

    # the same files again: reused; the stored run loads as a model (the models of the study,
    # trained or reused as run_study does, without ablating them again)
    again = api.train_experiment(cfg, progress=False)
    assert again[1].reused and again[1].run_id == hf.run_id
    run_id, loaded = api.load_model(f"runs:/{hf.run_id}")
    assert run_id == hf.run_id and loaded.spec.model.architecture == "hf"
    # changed weights: another model (a new model key), and the old run refuses to load
    weights = next(folder.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(Exception, match="weights of .* changed"):
        api.load_model(f"runs:/{hf.run_id}")
    changed = api.train_experiment(cfg, progress=False)
    assert not changed[1].reused and changed[1].key != hf.key


def test_a_missing_folder_is_refused_before_anything_is_written(tmp_path, root, capsys):
    from attnstudy.cli.main import main

    toml = tmp_path / "missing.toml"
    toml.write_text(
        '[experiment]\nname = "m"\n[data]\ntask = "copy"\nn_train = 20\n'
        '[[models]]\nmodel = { source = "hf:nowhere/tiny" }\n'
    )
    rc = main(["run", str(toml), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "nowhere/tiny: no such folder" in err
    assert len(err.strip().splitlines()) == 1
    assert not (root / "mlruns" / "mlflow.db").exists()


def test_ablate_a_folder_on_an_experiments_data(tmp_path, root, tiny_marian, capsys):
    import mlflow

    from attnstudy.cli.main import main

    toml = _experiment(tmp_path, tiny_marian, rnn=False)
    folder = tmp_path / tiny_marian.parent.name / tiny_marian.name
    args = ["ablate", f"hf:{folder}", "--data", str(toml), "--n-examples", "3", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    model_run = out.split("model run: runs:/")[1].split()[0]
    abl = out.split("ablation run: runs:/")[1].split()[0]
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    run = client.get_run(abl)
    assert run.data.tags["mlflow.parentRunId"] == model_run
    assert client.get_experiment(run.info.experiment_id).name == "hf-study"
    assert run.data.params["ablation.n_examples"] == "3"  # the flag over the file's 4
    assert json.loads(run.data.params["ablation.ablations"]) == [
        "permutation",
        "uniform",
        "alignment",
    ]
    assert "test/exact_match" in client.get_run(model_run).data.metrics
    # a second ablation reuses the model run; the stored run ablates without --data
    assert main(args) == 0
    assert f"model run: runs:/{model_run}" in capsys.readouterr().out
    # (the experiment's battery: the default one, adversarial and erase-until-flip included, ran
    # on the same model for most of this test's time; tests/models/test_hf.py runs every ablation)
    stored = ["ablate", f"runs:/{model_run}", "--n-examples", "2", "--quiet"]
    assert main([*stored, "--ablations", "permutation,uniform,alignment"]) == 0
    capsys.readouterr()
    for bad, message in (
        (["ablate", f"runs:/{model_run}", "--data", str(toml)], "already names its data"),
        (
            ["ablate", f"hf:{folder}", "--data", str(toml), "--tsv", "x.tsv"],
            "give the examples once",
        ),
        (["ablate", f"hf:{folder}"], "--tsv FILE or --data"),
    ):
        assert main(bad) == 2
        assert message in capsys.readouterr().err
