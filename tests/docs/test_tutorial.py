"""docs/tutorial.ipynb runs top to bottom as a reader's Jupyter runs it, offline, in a store of its
own: two tiny copy models trained and studied, the verdict read, a heatmap drawn, one example
opened, a Hugging Face folder ablated — through ``attnstudy.api`` (and the public figures module).
The committed notebook holds its outputs (``make tutorial`` re-executes it)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prerequisites import require  # noqa: E402

pytestmark = pytest.mark.slow

for module, why in (
    ("nbclient", "nbclient is not installed (pip install -e '.[dev]')"),
    ("ipykernel", "ipykernel is not installed (pip install -e '.[dev]')"),
    ("transformers", "transformers is not installed (pip install -e '.[hf]')"),
):
    require(importlib.util.find_spec(module) is not None, why, module_level=True)

from tutorial_run import TUTORIAL, execute  # noqa: E402  (same folder)

IMPORT = re.compile(r"^\s*(?:from\s+(\S+)\s+import|import\s+(\S+))", re.M)


def _texts(cell) -> str:
    """A code cell's printed text and plain-text results."""
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream" and o.get("name") == "stdout":
            out.append(o["text"])
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
    return "".join(out)


def test_the_tutorial_uses_public_names_only():
    """No ``attnstudy`` import or attribute with a leading underscore, and attnstudy is reached
    through ``attnstudy.api``, the public figures module and the tiny model builder."""
    import nbformat

    nb = nbformat.read(TUTORIAL, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    modules = {m for pair in IMPORT.findall(code) for m in pair if m}
    assert {m for m in modules if m.startswith("attnstudy")} == {
        "attnstudy",
        "attnstudy.analysis",
        "attnstudy.models.hf_tiny",
    }, modules
    assert not re.search(r"\b(?:api|figures|attnstudy[\w.]*)\._", code)
    assert "import api" in code and "import figures" in code and "import build_tiny" in code


def test_the_tutorial_runs_offline_and_shows_its_results(tmp_path):
    import nbformat

    store = tmp_path / "root"
    nb, seconds = execute(TUTORIAL, store, tmp_path / "jupyter")
    print(f"\ndocs/tutorial.ipynb executed in {seconds:.0f} s", file=sys.stderr)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in cells)
    texts = [_texts(c) for c in cells]
    everything = "\n".join(texts)
    # the study: both variants trained, ablated and reported, all in the notebook's own store
    study = next(t for t in texts if "ablation run" in t and "report:" in t)
    assert re.search(r"^additive-bahdanau: run \w{32}, test exact match [01]\.\d\d,", study, re.M)
    assert re.search(r"^none-bahdanau: run \w{32}, test exact match [01]\.\d\d,", study, re.M)
    report = Path(re.search(r"^report: (.+)$", study, re.M).group(1))
    assert report.is_file() and report.is_relative_to(store)
    # the verdict: four questions answered, uniqueness not measured by the reduced battery
    verdicts = re.findall(
        r"^verdict: used (\S+), unique (\S+), agrees (\S+), aligns (\S+)$", everything, re.M
    )
    assert len(verdicts) == 2, everything  # the copy model's and the Hugging Face folder's
    answers = ("yes", "no", "unclear")
    for used, unique, _, aligns in verdicts:
        assert used in answers and aligns in answers and unique == "n/a", verdicts
    (copy, hf) = verdicts
    assert copy[2] in answers and hf[2] == "n/a", verdicts  # the folder's battery: no importance
    # the heatmap: a PNG image
    images = [o for c in cells for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    import base64

    assert base64.b64decode(images[0]["data"]["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    # one example opened: its per-step table, and the browser's address opening it
    opened = next(t for t in texts if "| source:" in t)
    example_id = re.search(r"^(copy/test/\d+) \| source:", opened, re.M).group(1)
    assert "step" in opened and "target_token" in opened
    browser = next(t for t in texts if "#ex=" in t).strip()
    page, anchor = browser.split("#ex=")
    assert anchor == example_id and Path(page).is_file() and Path(page).is_relative_to(store)
    # the Hugging Face folder: examples of one's own text in its subwords, the battery on a TSV
    assert "('new', 'dog', 'stone', '<eos>') → ('new', 'dog', 'stone')" in everything
    assert "tsv hf-tiny-marian: 20 test examples, prefix reference;" in everything
    nbformat.validate(nb)


def test_the_committed_tutorial_shows_its_outputs():
    """The notebook is committed executed: every code cell with its outputs, the figure among
    them, so it reads on a page that cannot run it."""
    import nbformat

    nb = nbformat.read(TUTORIAL, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert cells and all(c.execution_count for c in cells)
    assert all(
        c.outputs for c in cells if not c.source.strip().startswith("from attnstudy.analysis")
    )
    assert sum("image/png" in o.get("data", {}) for c in cells for o in c.outputs) == 1
    assert not any(o.get("output_type") == "error" for c in cells for o in c.outputs)
