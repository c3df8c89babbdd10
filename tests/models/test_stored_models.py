"""Models saved by earlier versions load, migrated, and compute what they computed when saved.

``tests/fixtures/models/schema<N>/`` hold tiny model folders written by the code of schema N (their
``expected.json`` holds the logits for one input at that time). Every later change keeps them loading:
when the stored config changes, add a folder for the new schema and keep the old ones.
"""

import json
from pathlib import Path

import pytest
import torch

from attnstudy.config import SCHEMA_VERSION
from attnstudy.data.batching import collate
from attnstudy.data.types import Example
from attnstudy.models.io import load_model_dir

FIXTURES = Path(__file__).parents[1] / "fixtures" / "models"
FOLDERS = sorted(p for p in FIXTURES.glob("schema*/*") if p.is_dir())


def test_there_is_a_fixture_for_the_current_schema():
    assert (FIXTURES / f"schema{SCHEMA_VERSION}").is_dir()
    assert len(FOLDERS) >= 4


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_stored_model_loads_and_gives_the_same_logits(folder):
    expected = json.loads((folder.parent / "expected.json").read_text())[folder.name]
    loaded = load_model_dir(folder)
    assert loaded.spec.schema_version == SCHEMA_VERSION
    tgt = ("x",) if loaded.spec.data.task == "tsv" else ("a",)
    batch = collate(
        [Example("x", tuple(expected["source"]), tgt)], loaded.src_vocab, loaded.tgt_vocab
    )
    with torch.no_grad():
        logits = loaded.model(batch.src, batch.src_lengths, batch.tgt_in)
    torch.testing.assert_close(
        logits.flatten(), torch.tensor(expected["logits"]), atol=1e-5, rtol=0
    )


def test_schema_1_tsv_model_keeps_its_character_tokenization():
    spec = load_model_dir(FIXTURES / "schema1" / "tsv-additive-bahdanau").spec
    assert (spec.data.source_tokenization, spec.data.target_tokenization) == ("chars", "chars")
    spec2 = load_model_dir(FIXTURES / "schema2" / "tsv-additive-bahdanau").spec
    assert (spec2.data.source_tokenization, spec2.data.target_tokenization) == ("spaces", "spaces")
