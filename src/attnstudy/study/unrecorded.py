"""``attnstudy ablate hf:FOLDER --tsv FILE`` (without ``--record``): the battery on a pretrained model's
examples, its statistics and verdict printed, nothing recorded — no store opened, no MLflow
imported, no run, pages, figures or browser written (the quick look inseq's ``attribute``
command gives). What it prints is what the recorded ``ablate`` prints for the same model and
examples (:func:`attnstudy.pages.summary_lines.battery_lines`), less where the run and its
browser are.
"""

from __future__ import annotations

from pathlib import Path

from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.data.hf_folder import HF_PREFIX

PRETRAINED_ATTENTION = "pretrained"
"""The attention family a pretrained model is labelled with (its model run's ``attention`` tag)."""


def ablate_unrecorded(
    uri: str, tsv: str | Path, cfg: AblationConfig, *, progress: bool = True
) -> list[str]:
    """Run the battery ``cfg`` on the first ``cfg.n_examples`` examples of ``tsv`` with the
    ``save_pretrained`` folder ``uri`` (``hf:FOLDER``), recording nothing.

    Returns:
        The lines to print (:func:`attnstudy.pages.summary_lines.battery_lines`).

    Raises:
        HFError, DataError: an unusable folder or file, one line each.
    """
    from attnstudy.analysis.suite import run_suite
    from attnstudy.models.hf import load_pretrained
    from attnstudy.pages.summary_lines import battery_lines
    from attnstudy.study.pretrained_examples import tsv_examples

    folder = Path(uri.removeprefix(HF_PREFIX)).expanduser().resolve()
    model = load_pretrained(folder)
    examples = tsv_examples(model, tsv)[: cfg.n_examples]
    label = f"hf-{folder.name}"
    result = run_suite(
        model, examples, model.vocab, model.vocab, cfg, progress=progress, label=label
    )
    metrics = dict(result.summary) | {"ablation/n_examples": float(len(examples))}
    return battery_lines(
        f"tsv {label}", PRETRAINED_ATTENTION, metrics, cfg.flat(), skipped=result.skipped
    )
