"""``python -m attnstudy.models.hf_tiny`` prints its result only; a progress bar when asked."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def test_the_build_prints_no_progress_bar_unless_asked(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    from attnstudy.models import hf_tiny

    before = hf_logging.is_progress_bar_enabled()
    assert hf_tiny.main([str(tmp_path / "tiny"), "--steps", "0"]) == 0
    out, err = capfd.readouterr()
    assert out == f"saved: {tmp_path / 'tiny'}\n" and err == ""
    assert hf_tiny.main([str(tmp_path / "tiny"), "--steps", "0", "--progress"]) == 0
    out, err = capfd.readouterr()
    assert out == f"saved: {tmp_path / 'tiny'}\n" and "Writing model shards" in err
    assert hf_logging.is_progress_bar_enabled() == before  # the process's setting put back
