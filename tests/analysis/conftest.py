"""Fixtures for the analysis tests; helpers live in ``analysis_testkit``."""

from __future__ import annotations

import pytest
from analysis_testkit import FAST_ABLATIONS, VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab


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
