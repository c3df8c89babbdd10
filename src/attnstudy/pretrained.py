"""The battery on a researcher's own pretrained model: ``attnstudy ablate hf:FOLDER --tsv FILE``.

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
from attnstudy.api import timing_metrics
from attnstudy.data.alignment import parse_pharaoh
from attnstudy.data.types import DataError, Example
from attnstudy.tracking import Tracker
from attnstudy.tracking.schema import Artifact, Kind, Tag

__all__ = ["HF_PREFIX", "ablate_pretrained", "load_recorded", "read_tsv"]

HF_PREFIX = "hf:"
"""The URI scheme of a ``save_pretrained`` folder on the command line."""

TAG_FOLDER = "hf.folder"
TAG_DIGEST = "hf.digest"
TAG_TRANSFORMERS = "hf.transformers_version"


def read_tsv(path: str | Path) -> list[tuple[str, str, str | None]]:
    """Lines ``source<TAB>target[<TAB>links]`` of a UTF-8 file, as raw text.

    Raises:
        DataError: a missing or non-UTF-8 file, a blank line, a line with another number of
            fields or an empty field — naming file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; pass a TSV of source<TAB>target lines") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); convert it") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            raise DataError(f"{path}:{n}: blank line; remove it (one example per line)")
        fields = line.split("\t")
        if len(fields) not in (2, 3) or not all(f.strip() for f in fields[:2]):
            raise DataError(
                f"{path}:{n}: expected source<TAB>target[<TAB>links], got {len(fields)} field(s)"
            )
        rows.append((fields[0], fields[1], fields[2] if len(fields) == 3 else None))
    if not rows:
        raise DataError(f"{path}: no examples")
    return rows


def _examples(model, rows, path: Path) -> list[Example]:
    from attnstudy.models.hf import subword_examples

    words = []
    for n, (src, tgt, links) in enumerate(rows, 1):
        s, t = tuple(src.split(" ")), tuple(tgt.split(" "))
        alignment = None
        if links is not None and links.strip():
            try:
                alignment = parse_pharaoh(links, len(s), len(t))
            except ValueError as e:
                raise DataError(f"{path}:{n}: {e}") from None
        words.append(Example(f"{path.stem}/{n}", s, t, alignment))
    return subword_examples(model, words, " ", " ")


def _model_run(tracker: Tracker, exp_id: str, folder: Path, model, digests: dict) -> str:
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
        DataError: the recorded folder is gone or its config, tokenizer or weights changed.
    """
    from attnstudy.models.hf import HFError, folder_digests, load_pretrained

    run = tracker.get_run(run_id)
    folder = run.tags.get(TAG_FOLDER)
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
    experiment: str = "pretrained",
    progress: bool = True,
) -> tuple[str, str, object]:
    """Run the battery on a ``save_pretrained`` folder over a TSV's examples, tracked.

    Args:
        uri: ``hf:FOLDER`` or ``runs:/<model run>`` of an earlier call.
        tsv: the examples (see :func:`read_tsv`); the first ``cfg.n_examples`` are analysed.
        experiment: the MLflow experiment of the runs.

    Returns:
        (model run id, ablation run id, :class:`~attnstudy.analysis.suite.SuiteResult`).

    Raises:
        HFError, DataError: an unusable folder or file, one line each.
    """
    from attnstudy.analysis.suite import run_suite
    from attnstudy.models.hf import folder_digests, load_pretrained

    if uri.startswith("runs:/"):
        model_run_id = uri.removeprefix("runs:/").strip("/")
        model = load_recorded(tracker, model_run_id)
        folder = Path(tracker.get_run(model_run_id).tags[TAG_FOLDER])
    else:
        folder = Path(uri.removeprefix(HF_PREFIX)).expanduser().resolve()
        digests = folder_digests(folder)
        model = load_pretrained(folder)
        exp_id = tracker.experiment_id(experiment)
        model_run_id = _model_run(tracker, exp_id, folder, model, digests)
    tsv = Path(tsv)
    examples = _examples(model, read_tsv(tsv), tsv)[: cfg.n_examples]
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
        Tag.NOTE: f"the battery on {len(examples)} examples of {tsv.name}",
    }
    run_id = tracker.start_run(model_run.experiment_id, f"{label}/ablations", tags, model_run_id)
    with tracker.active(run_id):
        tracker.log_params(run_id, cfg.flat() | {"data": str(tsv)})
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
            )
            summary = dict(result.summary) | {"ablation/seconds": time.perf_counter() - t0}
            summary |= timing_metrics(result, cfg.prefix, summary["ablation/seconds"])
            tracker.log_artifact(run_id, steps_path, "ablations")
        if result.examples is not None and len(result.examples):
            tracker.log_table(run_id, result.examples, Artifact.EXAMPLES)
        if result.skipped:
            tracker.log_text(run_id, json.dumps(result.skipped, indent=2), Artifact.SKIPPED)
        tracker.log_metrics(run_id, summary)
    return model_run_id, run_id, result
