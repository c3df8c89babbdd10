import json

import pytest

from attnstudy.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocab


def test_build_is_sorted_with_specials_first_and_order_independent():
    v = Vocab.build([["c", "a"], ["b", "a"]])
    assert v.itos == ["<pad>", "<bos>", "<eos>", "<unk>", "a", "b", "c"]
    assert v.stoi["a"] == 4 and len(v) == 7
    assert Vocab.build([["b", "a"], ["c"]]).itos == v.itos


def test_encode_decode_and_unknown():
    v = Vocab.build([["a", "b"]])
    assert v.encode(["a", "z", "b"]) == [4, UNK_ID, 5]
    assert v.count_unknown(["a", "z", "y", "b"]) == 2
    assert v.decode([BOS_ID, 4, PAD_ID, 5, EOS_ID, 4]) == ["a", "b"]
    assert v.decode([4, UNK_ID]) == ["a", "<unk>"]


def test_json_round_trip():
    v = Vocab.build([["AH", "B", "K"]])
    back = Vocab.from_json(json.loads(json.dumps(v.to_json())))
    assert back.itos == v.itos and back.stoi == v.stoi


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"tokens": []},
        {"itos": "abc"},
        {"itos": ["<pad>", "<bos>", "<eos>"]},
        {"itos": ["<bos>", "<pad>", "<eos>", "<unk>"]},
        {"itos": ["<pad>", "<bos>", "<eos>", "<unk>", "a", "a"]},
        {"itos": ["<pad>", "<bos>", "<eos>", "<unk>", 3]},
    ],
)
def test_from_json_rejects_malformed(bad):
    with pytest.raises(ValueError):
        Vocab.from_json(bad)
