"""The battery interrupted after batch k and resumed from its journal gives the uninterrupted
run's per-step table (the Parquet file, byte for byte), per-example table, summary, step counts
and example records; a batch file of other settings, another batch or a cut file is never used."""

from __future__ import annotations

import struct
import zipfile

import pytest
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.heatmaps import Recorder
from attnstudy.analysis.suite import run_suite
from attnstudy.analysis.suite_state import Journal, StateError, batch_meta

KEY = {"ablation_key": "k1", "model_run": "m1", "code_digest": "c1"}
BATCH = 2


class Stop(KeyboardInterrupt):
    """The kill, raised inside the batch hook once batch ``k`` is kept."""


class KillAfter(Journal):
    def __init__(self, folder, key, k):
        super().__init__(folder, key)
        self.k = k

    def finished(self, state):
        super().finished(state)
        if state.index == self.k:
            raise Stop


@pytest.fixture(scope="module")
def setup():
    model = sharpen(tiny_model("additive", "bahdanau", seed=3))
    examples = make_examples(9, seed=1)  # 5 batches per prefix; the last example has no gold
    cfg = AblationConfig(
        ablations=["permutation", "permutation_global", "uniform", "adversarial", "alignment"],
        n_examples=9,
        bootstrap_resamples=50,
        permutation={"n": 5},
        adversarial={"steps": 2},
    )
    return model, examples, cfg


def suite(setup, path, journal=None):
    model, examples, cfg = setup
    rec = Recorder(cfg.prefix, max_records=6)  # fewer than the examples: the cap survives too
    res = run_suite(
        model,
        examples,
        VOCAB,
        VOCAB,
        cfg,
        progress=False,
        batch_size=BATCH,
        table_path=path,
        info={"fixed": True},
        recorder=rec,
        journal=journal,
    )
    return res, rec.result(), path.read_bytes()


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whole")
    out = suite(setup, tmp / "steps.parquet", Journal(tmp / "journal", KEY))
    assert len(list((tmp / "journal").iterdir())) == 10  # 5 greedy + 5 reference batches
    return out


@pytest.mark.parametrize("k", [0, 3, 4, 5, 8, 9])
def test_killed_after_batch_k_resumes_to_the_same_results(setup, uninterrupted, tmp_path, k):
    with pytest.raises(Stop):
        suite(setup, tmp_path / "steps.parquet", KillAfter(tmp_path / "j", KEY, k))
    assert not (tmp_path / "steps.parquet").exists()
    journal = Journal(tmp_path / "j", KEY)
    res, records, table = suite(setup, tmp_path / "steps.parquet", journal)
    want, want_records, want_table = uninterrupted
    assert journal.restorable(journal.plan) == 10  # it kept every batch it computed after
    assert table == want_table  # the streamed Parquet file, byte for byte
    assert res.examples.equals(want.examples)
    assert res.summary == want.summary and res.steps == want.steps
    assert res.primary_unit == want.primary_unit
    assert records == want_records and len(records) == 6
    assert set(res.seconds) == set(want.seconds)  # timings: the only thing that may differ


def test_batches_are_put_back_not_computed(setup, uninterrupted, tmp_path, monkeypatch):
    import attnstudy.analysis.suite as suite_module

    with pytest.raises(Stop):
        suite(setup, tmp_path / "steps.parquet", KillAfter(tmp_path / "j", KEY, 6))
    seen = []
    real = suite_module.prepare_batches

    def counting(model, examples, *a, **k):
        for b in real(model, examples, *a, **k):
            seen.append((b.prefix, tuple(ex.id for ex in b.examples)))
            yield b

    monkeypatch.setattr(suite_module, "prepare_batches", counting)
    res, _, table = suite(setup, tmp_path / "steps.parquet", Journal(tmp_path / "j", KEY))
    ids = [ex.id for ex in setup[1]]
    # batches 0–4 greedy, 5–9 reference: 0–6 put back, the reference batches 7–9 computed
    assert seen == [("reference", tuple(ids[s : s + 2])) for s in (4, 6, 8)]
    assert table == uninterrupted[2]


def test_other_settings_another_batch_or_a_cut_file_is_never_used(setup, uninterrupted, tmp_path):
    with pytest.raises(Stop):
        suite(setup, tmp_path / "steps.parquet", KillAfter(tmp_path / "j", KEY, 4))
    folder = tmp_path / "j"
    for other in ({**KEY, "ablation_key": "k2"}, {**KEY, "code_digest": "c2"}):
        assert Journal(folder, other).restorable(_plan(setup)) == 0
    plan = _plan(setup)
    assert Journal(folder, KEY).restorable(plan) == 5
    with pytest.raises(StateError, match="not batch 1"):
        batch_meta(folder / Journal.name(0), KEY, 1, plan)  # batch 0's file as batch 1
    with pytest.raises(StateError, match="other examples"):
        batch_meta(folder / Journal.name(0), KEY, 0, [(plan[0][0], ("x", "y")), *plan[1:]])
    # batch 2 cut short (a SIGKILL during its upload): the run resumes from batch 2
    data = (folder / Journal.name(2)).read_bytes()
    (folder / Journal.name(2)).write_bytes(data[: len(data) // 2])
    assert Journal(folder, KEY).restorable(plan) == 2
    with pytest.raises(StateError, match="not a whole batch file"):
        batch_meta(folder / Journal.name(2), KEY, 2, plan)
    # a damaged member (bytes flipped inside the zip): its CRC refuses it
    with zipfile.ZipFile(folder / Journal.name(1)) as z:
        info = z.getinfo("unit0/steps.parquet")
    raw = bytearray((folder / Journal.name(1)).read_bytes())
    name_len, extra_len = struct.unpack(
        "<HH", raw[info.header_offset + 26 : info.header_offset + 30]
    )
    start = info.header_offset + 30 + name_len + extra_len  # the member's data
    raw[start + info.compress_size // 2] ^= 0xFF
    (folder / Journal.name(1)).write_bytes(bytes(raw))
    assert Journal(folder, KEY).restorable(plan) == 1
    res, records, table = suite(setup, tmp_path / "steps.parquet", Journal(folder, KEY))
    assert table == uninterrupted[2] and res.summary == uninterrupted[0].summary


def _plan(setup):
    _, examples, _ = setup
    ids = [ex.id for ex in examples]
    return [
        (p, tuple(ids[s : s + BATCH])) for p in ("greedy", "reference") for s in range(0, 9, BATCH)
    ]


def test_a_resumed_run_counts_the_earlier_processes_seconds(setup, tmp_path, monkeypatch):
    """A resumed run's whole time is the earlier process's (up to its last kept batch) plus its
    own: ``ablation/seconds`` counted the resuming process only while ``timing/*`` added both.
    The clock is a fake one that advances 10 s per reading."""
    import attnstudy.analysis.suite as suite_module

    clock = iter(range(0, 10**6, 10))

    class FakeTime:
        @staticmethod
        def perf_counter():
            return float(next(clock))

    monkeypatch.setattr(suite_module, "time", FakeTime)
    with pytest.raises(Stop):
        suite(setup, tmp_path / "steps.parquet", KillAfter(tmp_path / "j", KEY, 3))
    import json

    def elapsed(k: int) -> float:
        with zipfile.ZipFile(tmp_path / "j" / Journal.name(k)) as z:
            return json.loads(z.read("meta.json"))["elapsed"]

    kept = [elapsed(k) for k in range(4)]
    assert kept == sorted(kept) and kept[0] > 0 and len(set(kept)) == 4  # each batch later
    res, _, _ = suite(setup, tmp_path / "steps2.parquet", Journal(tmp_path / "j", KEY))
    assert res.earlier_seconds == kept[3]
    assert elapsed(4) > kept[3]  # the resuming process's batches count on from there

    whole, _, _ = suite(setup, tmp_path / "steps3.parquet")  # not resumed
    assert whole.earlier_seconds == 0.0
