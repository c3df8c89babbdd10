"""Devices: where training and analysis run (``training.device``, ``ablation.device``).

No GPU is needed: the structural rule (every tensor factory of the models and the analysis names
its device) is checked on the source, and at run time by running the whole battery and decoding
under a torch function mode that refuses any tensor factory called without ``device=``;
resolution is checked with CUDA faked.
"""

from __future__ import annotations

import ast
import math
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

ROOT = Path(__file__).parents[2]
SCANNED = [ROOT / "src" / "attnstudy" / "models", ROOT / "analysis"]

FACTORIES = {
    "tensor",
    "as_tensor",
    "asarray",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "tril_indices",
    "triu_indices",
    "empty_strided",
    "Generator",
}
"""Factories of ``torch`` that create a tensor (or a generator) from nothing: each must say where.
``*_like`` and ``Tensor.new_*`` follow their argument and need no ``device=``."""


def factory_violations(source: str, filename: str = "<string>") -> list[str]:
    """``file:line torch.<factory>`` for every factory call without ``device=``, and every
    ``torch.from_numpy(…)`` (always on the CPU) not moved at once with ``.to(…)``."""
    tree = ast.parse(source, filename=filename)
    parent: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parent[child] = node
    out = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
        ):
            continue
        name = node.func.attr
        if name in FACTORIES and not any(k.arg == "device" for k in node.keywords):
            out.append(f"{filename}:{node.lineno} torch.{name} without device=")
        if name == "from_numpy":
            up = parent.get(node)
            moved = (
                isinstance(up, ast.Attribute)
                and up.attr == "to"
                and isinstance(parent.get(up), ast.Call)
            )
            if not moved:
                out.append(f"{filename}:{node.lineno} torch.from_numpy not followed by .to(device)")
    return out


def test_the_factory_check_finds_what_it_must():
    bad = (
        "import torch\n"
        "a = torch.zeros(3)\n"
        "b = torch.arange(4, device=x.device)\n"
        "c = torch.from_numpy(n)\n"
        "d = torch.from_numpy(n).to(dev)\n"
        "e = torch.Generator()\n"
        "f = x.new_zeros(3) + torch.zeros_like(x)\n"
    )
    assert factory_violations(bad) == [
        "<string>:2 torch.zeros without device=",
        "<string>:4 torch.from_numpy not followed by .to(device)",
        "<string>:6 torch.Generator without device=",
    ]


def test_every_tensor_factory_in_models_and_analysis_names_its_device():
    files = sorted(p for folder in SCANNED for p in folder.rglob("*.py"))
    assert len(files) > 20  # the folders are where they were
    found = [
        v
        for p in files
        for v in factory_violations(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    assert not found, "\n".join(found)


# ----------------------------------------------------------------------------- at run time


def _model(attention: str = "multihead", flow: str = "luong"):
    from attnstudy.config import ModelConfig, TransformerConfig
    from attnstudy.models import build_model

    torch.manual_seed(0)
    if flow == "transformer":
        cfg = TransformerConfig(
            architecture="transformer", layers=2, heads=2, d_model=8, d_ff=8, attention=attention
        )
        return build_model(cfg, 12, 12).eval()
    cfg = ModelConfig(
        attention=attention,
        flow=flow,
        embedding_dim=8,
        encoder_hidden=8,
        decoder_hidden=16,
        attention_dim=8,
        heads=2,
    )
    return build_model(cfg, 12, 12).eval()


def _examples(n: int = 5):
    from attnstudy.config import data_config
    from attnstudy.data.tasks import load_task

    cfg = data_config(task="copy", vocab_size=8, min_len=3, max_len=6, n_train=n, n_dev=1, n_test=1)
    return load_task(cfg).train


def _whole_battery(attention: str, flow: str):
    """``run_suite``'s first five arguments for every catalogue ablation, on small sizes: the
    model, five copy examples, their source and target vocabularies and the config."""
    from attnstudy.analysis.catalogue import AblationConfig, list_ablations

    from attnstudy.data.vocab import Vocab

    examples = _examples()
    cfg = AblationConfig(
        ablations=list_ablations(),
        n_examples=len(examples),
        bootstrap_resamples=20,
        permutation={"n": 4},
        adversarial={"steps": 3, "k": 2},
    )
    src_vocab = Vocab.build(ex.src for ex in examples)
    tgt_vocab = Vocab.build(ex.tgt for ex in examples)
    return _model(attention, flow), examples, src_vocab, tgt_vocab, cfg


class _ExplicitDevicesOnly(TorchFunctionMode):
    """Raises at the first tensor factory called without ``device=``, naming where it was called."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _device_constructors() and kwargs.get("device") is None:
            frame = next(
                f
                for f in reversed(traceback.extract_stack())
                if "/torch/" not in f.filename and f.filename != __file__
            )
            if "site-packages" in frame.filename:  # a library's own code (transformers): not ours
                return func(*args, **kwargs)
            raise AssertionError(
                f"{getattr(func, '__name__', func)} without device= at {frame.filename}:{frame.lineno}"
            )
        return func(*args, **kwargs)


@pytest.fixture
def explicit_devices():
    """Inside ``with explicit_devices():`` a tensor created without naming its device fails the
    test: every tensor of the code under test follows the model (or says it stays on the CPU)."""
    return _ExplicitDevicesOnly


@pytest.mark.parametrize(
    "attention,flow",
    [("multihead", "luong"), ("additive", "bahdanau"), ("multihead", "transformer")],
)
def test_the_whole_battery_keeps_every_tensor_on_the_models_device(
    attention, flow, explicit_devices
):
    from attnstudy.analysis.catalogue import get_ablation, list_ablations
    from attnstudy.analysis.suite import run_suite

    inputs = _whole_battery(attention, flow)  # built outside: only the battery is checked
    with explicit_devices():
        result = run_suite(*inputs, progress=False)
    # only what the family cannot do is skipped: on a recurrent encoder the catalogue's entries
    # that require self-attention (rollout, ALTI+), for that reason
    needs_self_attention = {
        n for n in list_ablations() if "self_attention" in get_ablation(n).requires
    }
    assert {"rollout", "alti_plus"} <= needs_self_attention
    expected = set() if flow == "transformer" else needs_self_attention
    assert set(result.skipped) == expected, result.skipped
    assert all("lacks self_attention" in why for why in result.skipped.values()), result.skipped
    assert result.table["permutation_median_tvd"].notna().any()
    assert all(math.isfinite(v) for v in result.summary.values())


@pytest.mark.parametrize("attention,flow", [("multihead", "luong"), ("additive", "bahdanau")])
def test_no_gradient_of_the_battery_goes_through_a_cudnn_rnn_in_eval_mode(
    attention, flow, monkeypatch
):
    """cuDNN's RNN kernels have no backward in eval mode: on an H200 the adversarial search raised
    "cudnn RNN backward can only be called in training mode" (benchmarks/bench_gpu.py, torch 2.11).
    Every RNN call of the whole battery that records a graph in eval mode must run with cuDNN off
    (``models.gradients_in_eval``). cuDNN is CUDA only, so the condition is checked here, on the
    CPU: every ``nn.GRU``/``nn.LSTM`` call is recorded with its mode, grad mode and cuDNN flag."""
    from attnstudy.analysis.suite import run_suite

    calls = []
    for cls in (torch.nn.GRU, torch.nn.LSTM, torch.nn.RNN):

        def recorded(self, *args, _forward=cls.forward, **kwargs):
            calls.append((self.training, torch.is_grad_enabled(), torch.backends.cudnn.enabled))
            return _forward(self, *args, **kwargs)

        monkeypatch.setattr(cls, "forward", recorded)
    assert torch.backends.cudnn.enabled
    run_suite(*_whole_battery(attention, flow), progress=False)
    assert torch.backends.cudnn.enabled  # restored
    with_grad = [c for c in calls if c[1]]
    assert with_grad, "no RNN call recorded a graph: the check would be vacuous"
    assert all(not training for training, _, _ in calls)  # the battery runs in eval mode
    assert [c for c in with_grad if c[2]] == []  # eval + grad + cuDNN: no backward on CUDA


def test_gradients_in_eval_restores_cudnn_after_an_error():
    from attnstudy.models import gradients_in_eval

    with torch.no_grad():
        with pytest.raises(RuntimeError, match="boom"), gradients_in_eval():
            assert torch.is_grad_enabled() and not torch.backends.cudnn.enabled
            raise RuntimeError("boom")
        assert torch.backends.cudnn.enabled and not torch.is_grad_enabled()


def test_a_pretrained_models_battery_keeps_every_tensor_on_its_device(tmp_path, explicit_devices):
    """The Hugging Face wrapper and the battery on it (a tiny BART built here, no download)."""
    import importlib.util

    from prerequisites import require

    require(importlib.util.find_spec("transformers") is not None, "the [hf] extra (transformers)")
    from attnstudy.analysis.catalogue import AblationConfig, list_ablations
    from attnstudy.analysis.suite import run_suite

    from attnstudy.data.types import Example
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny, copy_pairs

    model = load_pretrained(build_tiny(tmp_path / "bart", family="bart", tokenizer="bpe", steps=5))
    examples = [
        Example(f"hf/{i}", model.source_tokens(s), model.target_tokens(s))
        for i, s in enumerate(copy_pairs(4, seed=1))
    ]
    cfg = AblationConfig(
        ablations=list_ablations(),
        n_examples=len(examples),
        bootstrap_resamples=20,
        prefix="reference",
        permutation={"n": 4},
        adversarial={"steps": 3, "k": 2},
    )
    with explicit_devices():
        result = run_suite(model, examples, model.vocab, model.vocab, cfg, progress=False)
        hyps = model.greedy(*_hf_batch(model, examples), 8)
    assert result.table["permutation_median_tvd"].notna().any() and len(hyps) == len(examples)


def _hf_batch(model, examples):
    from attnstudy.data.batching import collate

    batch = collate(examples, model.vocab, model.vocab)
    return batch.src, batch.src_lengths


@pytest.mark.parametrize("flow", ["luong", "transformer"])
def test_decoding_keeps_every_tensor_on_the_models_device(flow, explicit_devices):
    from attnstudy.data.batching import collate
    from attnstudy.data.vocab import Vocab

    model = _model(flow=flow)
    examples = _examples(3)
    vocab = Vocab.build(ex.src for ex in examples)
    with explicit_devices():
        batch = collate(examples, vocab, vocab)
        greedy = model.greedy(batch.src, batch.src_lengths, 9)
        beams = model.beam_search(batch.src, batch.src_lengths, 9, beam_size=3)
    assert len(greedy) == len(beams) == 3
    assert all(isinstance(t, int) for hyp in beams for t in hyp)


def test_permutations_are_drawn_on_the_cpu_whatever_the_device():
    """The draw is made by a CPU generator and only then moved: the indices do not depend on where
    they end up (a draw on the device would follow that device's generator)."""
    from attnstudy.analysis.batch import step_generator
    from attnstudy.analysis.interventions import permutation_indices, permute

    here = permutation_indices(step_generator(0, "ex", 2, "permutation"), 3, 2, 5)
    moved = permutation_indices(step_generator(0, "ex", 2, "permutation"), 3, 2, 5, device="meta")
    assert moved.device.type == "meta" and here.device.type == "cpu"
    assert step_generator(0, "ex", 2, "permutation").device.type == "cpu"
    # the same draw as a plain CPU argsort of the generator's uniforms
    g = step_generator(0, "ex", 2, "permutation")
    assert torch.equal(here, torch.rand(3, 2, 5, generator=g).argsort(-1))
    weights = torch.softmax(torch.randn(2, 2, 3, 5), -1)
    valid = torch.ones(2, 5, dtype=torch.bool)
    out = permute(weights, valid, 3, lambda b, t: step_generator(0, f"e{b}", t, "p"))
    assert out.weights.device == weights.device and out.identity.device == weights.device


# ----------------------------------------------------------------------------- resolution


def test_device_names_resolve_on_this_machine(monkeypatch):
    from attnstudy.models.devices import (
        DeviceError,
        placed_by_scheduler,
        requests_gpu,
        resolve_device,
    )

    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match=r"training.device = 'cuda' but .*use 'cpu' or 'auto'"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="ablation.device = 'gpu'"):
        resolve_device("gpu", "ablation.device")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(DeviceError, match=r"shows 2 GPU\(s\)"):
        resolve_device("cuda:2")
    with placed_by_scheduler(gpu=False):  # a cluster task that asked for no GPU
        assert resolve_device("auto") == torch.device("cpu")
    with placed_by_scheduler(gpu=True):  # it sees the one GPU it was given as cuda:0
        assert resolve_device("cuda:1") == torch.device("cuda", 0)
        assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)  # outside the block again
    assert [requests_gpu(n) for n in ("auto", "cpu", "cuda", "cuda:3")] == [
        False,
        False,
        True,
        True,
    ]


def test_the_device_is_not_part_of_the_model_key_and_amp_is():
    """The keys of a default spec and of a G2P multihead spec are the ones the code computed before
    ``training.device`` and ``training.amp`` existed: old finished runs are still reused."""
    from attnstudy.config import ModelConfig, RunSpec, TrainingConfig, data_config

    def spec(data, model, **training):
        return RunSpec(
            experiment="e",
            seed=3,
            data=data_config(**data),
            model=ModelConfig(**model),
            training=TrainingConfig(**training),
        )

    plain = dict(data={"task": "copy"}, model={})
    g2p = dict(data={"task": "g2p"}, model={"attention": "multihead", "flow": "luong"})
    assert spec(**plain).model_key("d") == "46c61796a363e017"
    assert spec(**plain, device="cuda:1").model_key("d") == "46c61796a363e017"
    assert spec(**g2p, scheduling="plateau", device="cpu").model_key("d") == "2ad35e96b1934d20"
    assert spec(**plain, amp=True).model_key("d") != "46c61796a363e017"


def test_device_settings_are_validated_before_anything_runs():
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy.config import ConfigError
    from attnstudy.experiment import parse_experiment

    with pytest.raises(
        ConfigError, match=r"training.device: use 'auto', 'cpu', 'cuda' or 'cuda:N'"
    ):
        parse_experiment({"training": {"device": "gpu"}})
    with pytest.raises(ConfigError, match=r"ablation.device"):
        parse_experiment({"ablation": {"device": "cuda:x"}})
    assert parse_experiment({"ablation": {"device": "cuda:1"}}).ablation.device == "cuda:1"
    # where the analysis runs is not a setting of its results
    assert AblationConfig(device="cpu").resolved() == AblationConfig().resolved()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_cuda_on_a_machine_without_one_is_refused_before_the_store_is_touched(tmp_path, capsys):
    from attnstudy.cli import main as cli

    (tmp_path / "mlruns").mkdir()
    import os

    old = os.environ.get("ATTNSTUDY_ROOT")
    os.environ["ATTNSTUDY_ROOT"] = str(tmp_path)
    try:
        code = cli.main(
            [
                "run",
                str(ROOT / "experiments" / "tiny.toml"),
                "--quiet",
                "--set",
                "training.device='cuda'",
            ]
        )
    finally:
        if old is None:
            os.environ.pop("ATTNSTUDY_ROOT", None)
        else:
            os.environ["ATTNSTUDY_ROOT"] = old
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("attnstudy: error: training.device = 'cuda' but this torch")
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()


def test_mixed_precision_trains_on_the_cpu_and_keeps_float32_weights(tmp_path):
    """``training.amp`` under the CPU's bfloat16 autocast: the loss is finite, the stored weights and
    the model's outputs stay float32, and the numbers differ from a float32 training (it did run)."""
    from attnstudy.config import ModelConfig, RunSpec, TrainingConfig, data_config
    from attnstudy.data.tasks import load_task
    from attnstudy.data.vocab import Vocab
    from attnstudy.models.training import train

    def spec(amp: bool) -> RunSpec:
        return RunSpec(
            experiment="e",
            seed=1,
            data=data_config(
                task="copy", vocab_size=6, min_len=3, max_len=5, n_train=64, n_dev=8, n_test=8
            ),
            model=ModelConfig(
                embedding_dim=8, encoder_hidden=8, decoder_hidden=16, attention_dim=8
            ),
            training=TrainingConfig(epochs=1, batch_size=16, device="cpu", amp=amp),
        )

    splits = load_task(spec(False).data)
    src = Vocab.build(ex.src for ex in splits.train)
    tgt = Vocab.build(ex.tgt for ex in splits.train)
    runs = {
        amp: train(spec(amp), splits, src, tgt, tmp_path / str(amp), progress=False)
        for amp in (False, True)
    }
    for r in runs.values():
        assert math.isfinite(r.history[0]["train/loss"])
        assert all(p.dtype == torch.float32 for p in r.model.parameters())
    assert runs[True].history[0]["train/loss"] != runs[False].history[0]["train/loss"]
    assert abs(runs[True].history[0]["train/loss"] - runs[False].history[0]["train/loss"]) < 0.1
