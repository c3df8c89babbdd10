"""DecoderLens reaches the report through the catalogue alone: its table (layer 1's numbers with
intervals for the Transformer, the reason for the recurrent model it skips), its figure "what
each encoder layer already knows", its definition, and every layer's statistics in the store."""

from __future__ import annotations

import re

import pytest
from attnstudy.analysis import catalogue

INTERVAL = r"-?\d[\d.e-]* \[-?\d[\d.e-]*, -?\d[\d.e-]*\]"

pytestmark = pytest.mark.slow

EXPERIMENT = """
[experiment]
name = "lens"
seeds = [1]

[data]
task = "copy"
vocab_size = 8
min_len = 3
max_len = 6
n_train = 200
n_dev = 20
n_test = 20

[training]
epochs = 2
batch_size = 32

[ablation]
ablations = ["decoder_lens"]
n_examples = 6
bootstrap_resamples = 100

[[models]]
model = { architecture = "transformer", layers = 2, heads = 2, d_model = 16, d_ff = 32 }

[[models]]
model = { attention = "additive", flow = "bahdanau", embedding_dim = 8, encoder_hidden = 8, decoder_hidden = 16, attention_dim = 8 }
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    (root / "mlruns").mkdir()
    (root / "lens.toml").write_text(EXPERIMENT, encoding="utf-8")
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNSTUDY_ROOT", str(root))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        from attnstudy import api
        from attnstudy.experiment import load_experiment

        result = api.run(load_experiment(root / "lens.toml"), progress=False)
        yield result.report.parent
    finally:
        mp.undo()


def test_the_table_figure_and_definition_reach_the_report(report):
    md = (report / "report.md").read_text(encoding="utf-8")
    question = catalogue.get_ablation("decoder_lens").questions["decoder_lens"]
    assert question.title in md
    block = md.split(question.title, 1)[1].split("\n### ", 1)[0]
    header = next(x for x in block.splitlines() if x.startswith("| model"))
    labels = [s.stat.label for s in catalogue.shown_stats(["decoder_lens"])]
    assert [c.strip() for c in header.strip().strip("|").split("|")][-len(labels) :] == labels
    rows = [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| model")]
    transformer = next(r for r in rows if "transformer" in r)
    cells = [c.strip() for c in transformer.strip().strip("|").split("|")][-len(labels) :]
    # exact match, token error rate, teacher-forced accuracy, AER: numbers (with intervals where
    # the examples vary)
    assert all(re.fullmatch(rf"{INTERVAL}|-?\d[\d.e-]*", c) for c in cells), cells
    spec, fig = next((s, f) for s, f in catalogue.figures(["decoder_lens"]))
    assert f"![{fig.title}](figures/decoder_lens.png)" in md
    assert (report / "figures" / "decoder_lens.png").stat().st_size > 10_000
    assert "**DecoderLens**" in md
    assert transformer.split("|")[3].strip() == "per example"  # no decoder steps counted
