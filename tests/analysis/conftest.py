"""Fixtures for the analysis tests; helpers live in ``analysis_testkit``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from analysis_testkit import FAST_ABLATIONS, VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prerequisites import require  # noqa: E402


@pytest.fixture
def examples() -> list[Example]:
    return make_examples()


@pytest.fixture
def vocab() -> Vocab:
    return VOCAB


@pytest.fixture
def cfg() -> AblationConfig:
    return AblationConfig(
        n_permutations=12,
        n_random_orders=3,
        bootstrap_resamples=50,
        seed=3,
        ablations=FAST_ABLATIONS,
    )


@pytest.fixture(
    params=[("additive", "bahdanau"), ("multihead", "luong")], ids=["additive", "multihead"]
)
def model(request):
    return sharpen(tiny_model(*request.param))


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory):
    """A tiny pretrained Marian model (word-level tokenizer, seed 0, 20 fine-tuning steps on
    the copy task) built offline for the session by :func:`attnstudy.models.hf_tiny.build_tiny`
    and loaded by :func:`attnstudy.models.hf.load_pretrained`; shared, so tests must give back
    any mode they change."""
    require(
        importlib.util.find_spec("transformers") is not None,
        "transformers is not installed (pip install -e '.[hf]')",
    )
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny

    folder = build_tiny(tmp_path_factory.mktemp("hf") / "marian", steps=20)
    return load_pretrained(folder)
