import torch

from attnstudy.config import data_config
from attnstudy.data.batching import collate, make_batches
from attnstudy.data.tasks import load_task
from attnstudy.data.types import Example
from attnstudy.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocab


def ex(src, tgt, i=0):
    return Example(id=str(i), src=tuple(src), tgt=tuple(tgt))


def vocabs(examples):
    return Vocab.build(e.src for e in examples), Vocab.build(e.tgt for e in examples)


def test_collate_shapes_bos_eos_padding():
    examples = [ex("abc", "xy"), ex("a", "xyzx")]
    sv, tv = vocabs(examples)
    b = collate(examples, sv, tv, indices=[7, 3])
    a_, b_, c_ = sv.encode("abc")
    x, y, z = tv.encode("xyz")
    assert b.src.tolist() == [[a_, b_, c_], [a_, PAD_ID, PAD_ID]]
    assert b.src_lengths.tolist() == [3, 1]
    assert b.tgt_in.tolist() == [[BOS_ID, x, y, PAD_ID, PAD_ID], [BOS_ID, x, y, z, x]]
    assert b.tgt_out.tolist() == [[x, y, EOS_ID, PAD_ID, PAD_ID], [x, y, z, x, EOS_ID]]
    assert b.tgt_lengths.tolist() == [3, 5]
    assert b.indices == [7, 3] and b.size == 2
    assert b.src.dtype == torch.long and b.tgt_in.shape == b.tgt_out.shape == (2, 5)


def test_collate_unknown_tokens():
    sv, tv = vocabs([ex("ab", "x")])
    b = collate([ex("aq", "xw")], sv, tv)
    assert b.src[0, 1].item() == UNK_ID and b.tgt_out[0, 1].item() == UNK_ID and b.indices == [0]


def padding(batches):
    return sum(int((b.src == PAD_ID).sum()) + int((b.tgt_out == PAD_ID).sum()) for b in batches)


def data():
    return load_task(
        data_config(task="copy", n_train=400, n_dev=1, n_test=1, min_len=1, max_len=40)
    ).train


def test_every_example_once_and_rows_match_indices():
    examples = data()
    sv, tv = vocabs(examples)
    for bucket in (True, False):
        batches = make_batches(examples, sv, tv, batch_size=32, shuffle=True, seed=3, bucket=bucket)
        assert sorted(i for b in batches for i in b.indices) == list(range(400))
        assert [b.size for b in batches].count(32) == 12
        for b in batches:
            for row, i in enumerate(b.indices):
                n = b.src_lengths[row].item()
                assert sv.decode(b.src[row, :n].tolist()) == list(examples[i].src)


def test_bucketing_reduces_padding():
    examples = data()
    sv, tv = vocabs(examples)
    bucketed = make_batches(examples, sv, tv, 32, shuffle=True, seed=0, bucket=True)
    plain = make_batches(examples, sv, tv, 32, shuffle=True, seed=0, bucket=False)
    assert padding(bucketed) * 5 < padding(plain)


def test_deterministic_for_seed_and_shuffle_changes_order():
    examples = data()
    sv, tv = vocabs(examples)
    for bucket in (True, False):
        a = make_batches(examples, sv, tv, 16, shuffle=True, seed=1, bucket=bucket)
        b = make_batches(examples, sv, tv, 16, shuffle=True, seed=1, bucket=bucket)
        c = make_batches(examples, sv, tv, 16, shuffle=True, seed=2, bucket=bucket)
        assert [x.indices for x in a] == [x.indices for x in b]
        assert all(torch.equal(x.src, y.src) for x, y in zip(a, b))
        assert [x.indices for x in a] != [x.indices for x in c]
    ordered = make_batches(examples, sv, tv, 16, shuffle=False, bucket=False)
    assert [i for b in ordered for i in b.indices] == list(range(400))
    sorted_ = make_batches(examples, sv, tv, 16, shuffle=False, bucket=True)
    lengths = [len(examples[i].src) for b in sorted_ for i in b.indices]
    assert lengths == sorted(lengths)
