"""docs/own-data.md's one-file walkthrough: its TOML and its tiny file give the split it states."""

import re
import tomllib
from pathlib import Path

from attnstudy.config.data import validate_data_config
from attnstudy.data.tsv import load_tsv

ROOT = Path(__file__).parents[2]


def test_the_one_file_walkthrough_splits_as_it_says(tmp_path):
    text = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")
    section = text.split("## One file: let attnstudy split it", 1)[1]
    toml = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    tsv = re.search(r"```tsv\n(.*?)```", section, re.S).group(1)
    data = tomllib.loads(toml)["data"]
    (tmp_path / "numbers.tsv").write_text(tsv, encoding="utf-8")
    data["train_path"] = str(tmp_path / "numbers.tsv")
    splits = load_tsv(validate_data_config(data))
    lines = {
        name: [int(ex.id.rsplit("/", 1)[1]) for ex in getattr(splits, name)]
        for name in ("train", "dev", "test")
    }
    assert lines["test"] == [2, 14, 18, 19]
    assert lines["dev"] == [9, 11]
    assert len(lines["train"]) == 14 and {1, 13} <= set(lines["train"])  # both `one` lines
    assert "test holds lines 2, 14, 18 and 19" in section and "dev lines 9 and 11" in section
