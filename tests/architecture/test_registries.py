"""The registries are the one source of each name list: model families, attention scores and tasks;
no comparison of ``architecture`` with a literal outside the family registry."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Literal

import pytest

ROOT = Path(__file__).parents[2]


def test_every_family_is_configured_and_has_the_capabilities_it_declares(tmp_path):
    from attnstudy.analysis.contract import capabilities

    from attnstudy.config import MODEL_CONFIGS, ModelConfig, TransformerConfig
    from attnstudy.models.families import FAMILIES, build_model

    assert list(FAMILIES) == list(MODEL_CONFIGS)
    for name, family in FAMILIES.items():
        assert family.config is MODEL_CONFIGS[name]
        assert family.pretrained == MODEL_CONFIGS[name].pretrained
    built = {
        "rnn": build_model(ModelConfig(), 9, 9),
        "transformer": build_model(TransformerConfig(architecture="transformer"), 9, 9),
    }
    pytest.importorskip("transformers")
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny

    built["hf"] = load_pretrained(build_tiny(tmp_path / "hf", steps=0))
    for name, model in built.items():
        assert capabilities(model) == set(FAMILIES[name].capabilities), name


def test_a_pretrained_family_is_not_built_and_an_unknown_one_is_named():
    from attnstudy.config import PretrainedConfig
    from attnstudy.models.families import build_model, get_family

    with pytest.raises(ValueError, match="not built here"):
        build_model(PretrainedConfig(source="hf:/nowhere"), 9, 9)
    with pytest.raises(ValueError, match="unknown model family 'lstm2'; known: rnn"):
        get_family("lstm2")


def test_a_users_own_family_registers_and_builds():
    """docs/own-model.md's model, registered as a family of its own (Python API)."""
    import sys

    from pydantic import BaseModel

    sys.path.insert(0, str(ROOT / "tests" / "analysis"))
    try:
        from own_model import BagOfEmbeddingsAttention
    finally:
        sys.path.remove(str(ROOT / "tests" / "analysis"))
    from attnstudy.analysis.contract import capabilities

    from attnstudy.models.families import (
        FAMILIES,
        ModelFamily,
        build_model,
        register_family,
        unregister_family,
    )

    class OwnConfig(BaseModel):
        architecture: Literal["own"] = "own"
        dim: int = 6

    family = ModelFamily(
        "own",
        OwnConfig,
        lambda cfg, src, tgt: BagOfEmbeddingsAttention(vocab_size=max(src, tgt), dim=cfg.dim),
        "model files",
        "own_model:load",
        ("attention", "local", "global", "gradients"),
    )
    register_family(family)
    try:
        model = build_model(OwnConfig(), 9, 9)
        assert capabilities(model) == set(family.capabilities)
        with pytest.raises(ValueError, match="already registered"):
            register_family(family)
    finally:
        unregister_family("own")
    assert "own" not in FAMILIES
    unregister_family("rnn")  # a built-in family is never removed
    assert "rnn" in FAMILIES


def test_the_attention_names_of_the_config_are_the_implemented_scores():
    """The config reads the scores and the fields each uses from the registry's source (torch-
    free): what it read is what the registry holds."""
    from attnstudy import config
    from attnstudy.config.models import SCORE_FIELDS
    from attnstudy.models.attention import ATTENTIONS

    assert config.ATTENTIONS == tuple(ATTENTIONS)
    assert {n: (f.uses, f.heads) for n, f in SCORE_FIELDS.items()} == {
        n: (s.uses, s.heads) for n, s in ATTENTIONS.items()
    }
    # the fields a model keys and accepts, and its heads, follow the entry
    assert config.ModelConfig(attention="multihead_general", heads=8).n_heads == 8
    assert "attention_dim" not in config.ModelConfig(attention="dot").used_fields()


def _literal_comparisons(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = {s.attr if isinstance(s, ast.Attribute) else getattr(s, "id", None) for s in sides}
        literal = any(
            isinstance(s, ast.Constant | ast.Tuple | ast.List | ast.Set)
            and not (isinstance(s, ast.Constant) and s.value is None)
            for s in sides
        )
        if names & {"architecture", "arch"} and literal:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_comparison_of_the_architecture_with_a_literal_outside_the_registry():
    files = [*(ROOT / "src" / "attnstudy").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]
    found = [f for p in files for f in _literal_comparisons(p)]
    assert found == []


def _task_name_comparisons(path: Path, tasks: set[str]) -> list[str]:
    """Comparisons with a task's name as a literal (``task == "g2p"``, ``x in ("g2p", …)``), and
    literal tables keyed by task names (``(("g2p", "cmudict"), …)``)."""

    def literals(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return set().union(*(literals(e) for e in node.elts)) if node.elts else set()
        return set()

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            named = set().union(*(literals(s) for s in [node.left, *node.comparators])) & tasks
        elif isinstance(node, ast.For):
            named = literals(node.iter) & tasks
        else:
            continue
        if named:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(named)}")
    return found


def test_task_names_are_compared_only_in_the_task_registry():
    """What a task means elsewhere (its label, its data package, its metrics) is an attribute of
    its registry entry (the report called the Greek–English task "synthetic nt-greek-english")."""
    from attnstudy.data.tasks import TASKS

    registry = ROOT / "src" / "attnstudy" / "data" / "tasks.py"
    files = [*(ROOT / "src" / "attnstudy").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]
    found = [f for p in files if p != registry for f in _task_name_comparisons(p, set(TASKS))]
    assert found == []


def test_every_task_has_a_label_and_no_real_task_is_called_synthetic():
    from attnstudy.data import synthetic
    from attnstudy.data.tasks import TASKS, data_label

    for name in TASKS:
        label = data_label({"data.task": name})
        assert label and (label.startswith("synthetic ") == (name in synthetic.ORDERS)), label
    nt = data_label({"data.task": "nt-greek-english", "data.direction": "en-grc"})
    assert nt == "New Testament, SBLGNT Greek and BSB English (en-grc)"
    assert data_label({"data.task": "g2p"}) == "CMUdict"
    assert data_label({"data.task": "copy", "data.vocab_size": "20"}) == (
        "synthetic copy, vocabulary 20"
    )
    assert data_label({}) == "synthetic ?"  # a run that logged no task, as before
