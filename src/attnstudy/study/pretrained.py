"""The battery on a researcher's own pretrained model: ``attnstudy ablate hf:FOLDER --tsv FILE``,
``attnstudy ablate hf:FOLDER --data EXPERIMENT.toml``, and study variants ``[model] source =
"hf:FOLDER"`` (:func:`evaluate_pretrained`, :func:`load_model_run`, :func:`analysed_examples`).

The first use of a folder creates a *model run* recording the folder, the digests of its config,
tokenizer and weights (:func:`attnstudy.models.hf.folder_digests`) and the transformers version;
the ablation run nests under it, and a later use of the same folder with the same digests reuses
that model run. ``ablate runs:/<that run>`` re-reads the recorded folder and refuses in one line if
it is gone or its digests changed (:func:`load_recorded`).

The data: a UTF-8 TSV file, one example per line, ``source<TAB>target`` — raw text, tokenized by
the model's own tokenizer — and optionally a third field of 0-based Pharaoh links between
space-separated words: the alignment ablation sums a source word's subword attention and averages
over a target word's subwords (:func:`attnstudy.models.hf.subword_examples`,
:func:`attnstudy.analysis.ablations.alignment.word_attention`). Leave-one-out and erasure work
on subword tokens (their unit), as the model sees its input.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.data.hf_folder import HF_PREFIX
from attnstudy.data.types import DataError, Example
from attnstudy.pages import run_pages
from attnstudy.runtime.progress import reporting
from attnstudy.study.pretrained_examples import (  # re-exported: their public home was here
    _examples,
    read_tsv,
    text_examples,
    tsv_examples,
)
from attnstudy.tracking import Tracker
from attnstudy.tracking.schema import Artifact, Kind, RunRecord, Tag, ablation_run_name

__all__ = [
    "HF_PREFIX",
    "ablate_pretrained",
    "analysed_examples",
    "evaluate_pretrained",
    "load_model_run",
    "load_recorded",
    "read_tsv",
    "text_examples",
    "tsv_examples",
]

TAG_FOLDER = "hf.folder"
TAG_DIGEST = "hf.digest"
TAG_TRANSFORMERS = "hf.transformers_version"


def _model_run(tracker: Tracker, exp_id: str, folder: Path, *, model, digests: dict) -> str:
    import transformers

    digest = json.dumps(digests, sort_keys=True)
    for run in tracker.search_runs([exp_id], f"tags.{Tag.KIND} = '{Kind.MODEL}'"):
        same = run.tags.get(TAG_FOLDER) == str(folder) and run.tags.get(TAG_DIGEST) == digest
        if same and run.status == "FINISHED":
            return run.run_id
    cfg = model.hf.config
    label = f"hf-{folder.name}"
    tags = {
        Tag.KIND: Kind.MODEL,
        Tag.TASK: "tsv",
        Tag.ATTENTION: "pretrained",
        Tag.ARCHITECTURE: f"hf:{cfg.model_type}",
        Tag.LAYERS: str(model.layers),
        Tag.HEADS: str(model.heads),
        Tag.VARIANT: label,
        TAG_FOLDER: str(folder),
        TAG_DIGEST: digest,
        TAG_TRANSFORMERS: transformers.__version__,
        Tag.NOTE: f"pretrained {cfg.model_type} model from {folder} (evaluated, not trained here)",
    }
    run_id = tracker.start_run(exp_id, label, tags)
    with tracker.active(run_id):
        tracker.log_params(
            run_id,
            {
                "model_type": cfg.model_type,
                "layers": model.layers,
                "heads": model.heads,
                "d_model": getattr(cfg, "d_model", ""),
                "vocab_size": cfg.vocab_size,
                "folder": str(folder),
            },
        )
        tracker.log_text(run_id, cfg.to_json_string(), "hf/config.json")
    return run_id


def load_recorded(tracker: Tracker, run_id: str):
    """The pretrained model of a model run made by :func:`ablate_pretrained`.

    Raises:
        DataError: the run is not such a model run (a model trained by attnstudy names its own
            data), or the recorded folder is gone or its config, tokenizer or weights changed.
        ModelNotFoundError, DeletedError: there is no such run, or it is deleted.
    """
    from attnstudy.models.hf import HFError, folder_digests, load_pretrained

    run = tracker.find_run(run_id, again="ablate hf:FOLDER again to record the model anew")
    folder = run.tags.get(TAG_FOLDER)
    if folder is None:
        raise DataError(
            f"runs:/{run_id} is not a pretrained model's run (hf:FOLDER), so --tsv does not apply: "
            "a model trained here already names its data; drop --tsv"
        )
    try:
        digests = folder_digests(folder)
    except HFError as e:
        raise DataError(f"runs:/{run_id}: the recorded model folder is unusable: {e}") from None
    recorded = json.loads(run.tags[TAG_DIGEST])
    changed = sorted(k for k in recorded if recorded[k] != digests.get(k))
    if changed:
        raise DataError(
            f"runs:/{run_id}: the {', '.join(changed)} of {folder} changed since this run "
            "recorded it; ablate hf:FOLDER again to record the model as it is now"
        )
    return load_pretrained(folder)


def ablate_pretrained(
    uri: str,
    tsv: str | Path,
    cfg: AblationConfig,
    tracker: Tracker,
    *,
    experiment: str = "pretrained",
    progress: bool = True,
) -> tuple[str, str, object]:
    """Run the battery on a ``save_pretrained`` folder over a TSV's examples, tracked: the
    ablation run has the pages of every ablation run (example browser, tables, figures, verdict:
    :func:`attnstudy.pages.run_pages.log_ablation_pages`) and ``ablation/n_examples``, the number of
    examples analysed (what ``ablate`` prints and the verdict counts; without it they read the
    cap, ``ablation.n_examples``).

    Args:
        uri: ``hf:FOLDER`` or ``runs:/<model run>`` of an earlier call.
        tsv: the examples (see :func:`read_tsv`); the first ``cfg.n_examples`` are analysed.
        experiment: the MLflow experiment of the runs.

    Returns:
        (model run id, ablation run id, :class:`~attnstudy.analysis.suite.SuiteResult`).

    Raises:
        HFError, DataError: an unusable folder or file, one line each.
    """
    model_run_id, model, folder = _pretrained_model_run(uri, tracker, experiment)
    tsv = Path(tsv)
    examples = _examples(model, read_tsv(tsv), tsv.stem, lambda n: f"{tsv}:{n}")
    examples = examples[: cfg.n_examples]
    model_run = tracker.get_run(model_run_id)
    label = model_run.tags.get(Tag.VARIANT, f"hf-{folder.name}")
    tags = {
        Tag.KIND: Kind.ABLATION,
        Tag.TASK: "tsv",
        Tag.VARIANT: label,
        Tag.ARCHITECTURE: model_run.tags.get(Tag.ARCHITECTURE, ""),
        Tag.LAYERS: str(model.layers),
        Tag.HEADS: str(model.heads),
        Tag.SOURCE_RUN_ID: model_run_id,
        Tag.NOTE: f"the battery on {len(examples)} examples of {tsv.resolve()}",
    }
    run_id = tracker.start_run(
        model_run.experiment_id, ablation_run_name(label), tags, model_run_id
    )
    with (  # CPU and memory as system/*, progress/fraction, as a trained model's run
        tracker.active(run_id),
        tracker.system_metrics(run_id),
        reporting(tracker.progress_sink(run_id)),
    ):
        result = _ablate_logged(
            tracker,
            run_id,
            model_run=model_run,
            model=model,
            examples=examples,
            cfg=cfg,
            tsv=tsv,
            tags=tags,
            progress=progress,
        )
    return model_run_id, run_id, result


def _pretrained_model_run(uri: str, tracker: Tracker, experiment: str) -> tuple[str, object, Path]:
    """The model of :func:`ablate_pretrained`'s ``uri`` and its model run: the recorded run of
    ``runs:/<id>``, or a ``hf:FOLDER`` loaded and recorded in ``experiment`` (a run of its own,
    reused when the folder's digests match). Returns (model run id, model, folder)."""
    from attnstudy.models.hf import folder_digests, load_pretrained

    if uri.startswith("runs:/"):
        model_run_id = uri.removeprefix("runs:/").strip("/")
        model = load_recorded(tracker, model_run_id)
        return model_run_id, model, Path(tracker.get_run(model_run_id).tags[TAG_FOLDER])
    folder = Path(uri.removeprefix(HF_PREFIX)).expanduser().resolve()
    digests = folder_digests(folder)
    model = load_pretrained(folder)
    exp_id = tracker.experiment_id(experiment)
    return _model_run(tracker, exp_id, folder, model=model, digests=digests), model, folder


def _ablate_logged(
    tracker: Tracker,
    run_id: str,
    *,
    model_run: RunRecord,
    model,
    examples: list[Example],
    cfg: AblationConfig,
    tsv: Path,
    tags: dict[str, str],
    progress: bool,
):
    """:func:`ablate_pretrained`'s battery inside its open ablation run ``run_id``: the params,
    the per-step table, the examples, the run's pages, skipped ablations and the summary metrics
    logged. Returns the :class:`~attnstudy.analysis.suite.SuiteResult`."""
    from attnstudy.analysis.heatmaps import Recorder
    from attnstudy.analysis.suite import run_suite

    model_run_id = model_run.run_id
    label = tags[Tag.VARIANT]
    params = cfg.flat() | {"data": str(tsv.resolve())}  # absolute: no working directory
    tracker.log_params(run_id, params)
    recorder = Recorder(cfg.prefix)
    with tempfile.TemporaryDirectory(prefix="attnstudy-ablate-") as tmp:
        steps_path = Path(tmp) / "steps.parquet"
        t0 = time.perf_counter()
        result = run_suite(
            model,
            examples,
            model.vocab,
            model.vocab,
            cfg,
            progress=progress,
            table_path=steps_path,
            label=label,
            recorder=recorder,
        )
        summary, timing = run_pages.log_battery(
            tracker,
            run_id,
            result,
            prefix=cfg.prefix,
            started=t0,
            n_examples=len(examples),
            steps_path=steps_path,
        )
        summary |= timing
        # the example browser, tables, figures and verdict of every other ablation run
        run_pages.log_ablation_pages(
            tracker,
            run_id,
            model_run_id,
            name=run_pages.variant_name(tags),
            attention=model_run.tags.get(Tag.ATTENTION, "pretrained"),
            examples=examples,
            params=params,
            summary=summary,
            steps_path=steps_path,
            per_example=result.examples,
            records=recorder.result(),
            task="tsv",
        )
    run_pages.log_outcome(tracker, run_id, result, summary)
    return result


# --- pretrained variants of a study (``[model] source = "hf:FOLDER"``) -----------------------------
JOIN = {"spaces": " ", "chars": ""}
"""How a tokenization's tokens make the text again (what the model's tokenizer reads)."""


def _joins(spec) -> tuple[str, str]:
    from attnstudy.data.tasks import get_task

    src, tgt = get_task(spec.data.task).tokenization(spec.data)
    return JOIN[src], JOIN[tgt]


def analysed_examples(model, spec, examples: list[Example]) -> list[Example]:
    """The task's examples as the pretrained model sees them: each source and reference joined
    into text by the task's tokenization (``spaces``: one space; ``chars``: nothing) and
    re-tokenized by the model's tokenizer, gold links kept between the task's tokens
    (:func:`attnstudy.models.hf.subword_examples`).

    Raises:
        HFError: gold links the tokenizer's subwords cannot be mapped back to.
    """
    from attnstudy.models.hf import subword_examples

    src_join, tgt_join = _joins(spec)
    return subword_examples(model, examples, src_join, tgt_join)


def decode_words(model, spec, examples: list[Example], batch_size: int = 64) -> list[list[str]]:
    """Greedy decoding of the task's examples, as the task's tokens.

    Each source is re-tokenized (:func:`analysed_examples`), decoded greedily with a budget of
    ``ceil(training.max_decode_factor × T_x) + 2`` steps (T_x in subword tokens, EOS included),
    detokenized by the model's tokenizer and split by the task's target tokenization, so the
    metrics compare words with words (not one subword segmentation with another).

    Returns:
        One token list per example.
    """
    import math

    import torch

    from attnstudy.data.batching import make_batches
    from attnstudy.data.vocab import Vocab

    sub = analysed_examples(model, spec, examples)
    _, tgt_join = _joins(spec)
    vocab: Vocab = model.vocab
    factor = spec.training.max_decode_factor
    hyps: list[list[str]] = [[] for _ in examples]
    with torch.no_grad():
        for batch in make_batches(sub, vocab, vocab, batch_size, shuffle=False):
            budget = int(math.ceil(factor * int(batch.src_lengths.max()))) + 2
            out = model.greedy(batch.src, batch.src_lengths, budget)
            for i, ids, n in zip(batch.indices, out, batch.src_lengths.tolist()):
                text = model.detokenize(ids[: int(math.ceil(factor * n)) + 2])
                hyps[i] = list(text) if tgt_join == "" else text.split()
    return hyps


def evaluate_pretrained(
    spec,
    splits,
    *,
    data_digest: str,
    digests: dict[str, str],
    tracker: Tracker,
    experiment_id: str,
    study_id: str | None,
    tags: dict[str, str],
) -> tuple[str, dict[str, float]]:
    """The model run of a pretrained variant (``model.source = "hf:FOLDER"``): the folder
    recorded, the model evaluated on the task's test split (greedy decoding, the task's metrics
    and predictions table, as a trained model's run), nothing trained. Called by
    :func:`attnstudy.api.train_spec`, which reuses a finished run of the same model key instead.

    Args:
        splits: the task's :class:`~attnstudy.data.types.Splits`; ``data_digest`` their digest.
        digests: the folder's (:func:`attnstudy.data.hf_folder.folder_digests`).
        tags: the run's tags (kind, task, variant, model key, study).

    Returns:
        (run id, final metrics).

    Raises:
        HFError: an unusable folder. DataError: bad data.
    """
    import pandas as pd
    import transformers

    from attnstudy.data.tasks import get_task
    from attnstudy.models.hf import load_pretrained
    from attnstudy.pages import run_pages
    from attnstudy.scoring.metrics import evaluate, heldout_metrics, per_example

    folder = Path(spec.model.folder)
    model = load_pretrained(folder)
    tags = tags | {
        Tag.ARCHITECTURE: f"hf:{model.hf.config.model_type}",
        TAG_FOLDER: str(folder),
        TAG_DIGEST: json.dumps(digests, sort_keys=True),
        TAG_TRANSFORMERS: transformers.__version__,
        Tag.DEVICE: "cpu",
    }
    run_id = tracker.start_run(experiment_id, spec.name, tags, study_id)
    # CPU and memory as system/*, progress/fraction while it runs (as a trained model's run)
    with (
        tracker.active(run_id),
        tracker.system_metrics(run_id),
        reporting(tracker.progress_sink(run_id)),
    ):
        datasets = run_pages.log_model_datasets(tracker, run_id, spec, splits)
        params, full = spec.flat_params()
        tracker.log_params(
            run_id,
            params
            | {
                "model.model_type": model.hf.config.model_type,
                "model.layers": model.layers,
                "model.heads": model.heads,
                "model.vocab_size": model.hf.config.vocab_size,
                "data.n_test_examples": len(splits.test),
                "data.digest": data_digest,
            },
        )
        if full:
            tracker.log_text(run_id, json.dumps(full, indent=2), Artifact.PARAMS_FULL)
        tracker.log_text(run_id, spec.model_dump_json(indent=2), Artifact.CONFIG)
        tracker.log_text(run_id, model.hf.config.to_json_string(), "hf/config.json")
        t0 = time.perf_counter()
        hyps = decode_words(model, spec, list(splits.test))
        task = get_task(spec.data.task)
        final = {
            f"test/{k}": v
            for k, v in evaluate(hyps, list(splits.test), error_rate=task.error_rate).items()
        }
        final["test/decode_seconds"] = time.perf_counter() - t0
        final.update(heldout_metrics(hyps, splits.test, task.heldout, task.error_rate))
        preds = pd.DataFrame(per_example(hyps, splits.test))
        preds.insert(0, "example_id", [ex.id for ex in splits.test])
        preds.insert(1, "src_len", [len(ex.src) for ex in splits.test])
        tracker.log_table(run_id, preds, Artifact.PREDICTIONS)
        tracker.log_metrics(run_id, final, dataset=datasets["test"])
        em = final.get("test/exact_match", float("nan"))
        tracker.set_tags(
            run_id,
            {
                Tag.NOTE: (
                    f"pretrained {model.hf.config.model_type} model from {folder} "
                    f"({model.layers} decoder layers × {model.heads} heads), evaluated here on "
                    f"{len(splits.test)} test examples of task {spec.data.task} (greedy exact "
                    f"match {em:.3f}); not trained here"
                )
            },
        )
    return run_id, final


def load_model_run(tracker: Tracker, run_id: str):
    """The model of a pretrained variant's model run (:func:`evaluate_pretrained`) as a
    :class:`attnstudy.models.io.LoadedModel`: the recorded folder, refused if it changed.

    Raises:
        DataError: the folder is gone or changed (:func:`load_recorded`), or the run has no
            stored config (a run of ``ablate hf:FOLDER --tsv``: ablate it with ``--tsv`` again).
    """
    from attnstudy.config import RunSpec
    from attnstudy.models.io import LoadedModel

    if not tracker.has_artifact(run_id, Artifact.CONFIG):
        raise DataError(
            f"runs:/{run_id} is a pretrained model recorded by ablate hf:FOLDER --tsv FILE, "
            "without a task: ablate it with --tsv FILE again"
        )
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tracker.download_artifact(run_id, Artifact.CONFIG, tmp)).read_text("utf-8")
    spec = RunSpec.model_validate_json(text)
    model = load_recorded(tracker, run_id)
    return LoadedModel(model, spec, model.vocab, model.vocab)
