"""The MLflow UI and the report in a real browser (Debian's chromium driven by Playwright).

Against the tiny study logged in the session store: ``attnstudy ui`` is started as a user runs it, the
study run, its model runs and their ablation runs are each reached by run page (MLflow's runs table
nests runs only in some sort orders and does not indent grandchildren), the nesting is checked where
the UI shows it (the runs table's expander under the study; "Parent run" on each run page), a figure
artifact is opened and its image must load, and the generated report must show every image and a row
in every table. Screenshots go to ``test-output/screenshots/``. Without chromium or playwright the
module is skipped, with the reason printed (under ``CI=true`` it fails: see prerequisites.py).
"""

import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from prerequisites import require

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


require(
    os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK),
    f"{CHROMIUM} not found: install Debian's chromium (`make test-deps`, i.e. apt-get install chromium)",
    module_level=True,
)
try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError as err:
    require(
        False, f"playwright is not installed ({err}): pip install -e '.[dev]'", module_level=True
    )

from test_ui import interrupt_and_check_gone, start_ui, wait_url  # noqa: E402  (same folder)

from attnstudy.serving import ui  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_study, store_root, tmp_path_factory):
    """``attnstudy ui`` on a free port against the tiny study's store: dict with base, url, exp_id."""
    port = ui.free_port()
    err = tmp_path_factory.mktemp("ui") / "stderr.txt"
    proc, lines = start_ui(["--port", str(port), "--experiment", "tiny"], store_root, err)
    try:
        t0 = time.monotonic()
        url = wait_url(proc, lines, err)
        print(
            f"\nattnstudy ui answered after {time.monotonic() - t0:.1f} s: {url}", file=sys.stderr
        )
        base = f"http://127.0.0.1:{port}"
        yield {"base": base, "url": url, "exp_id": ui.experiment_id_by_name(base, "tiny")}
        interrupt_and_check_gone(proc, port)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="attnstudy-chromium-")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        ctx.set_default_timeout(30_000)
        try:
            yield ctx
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser):
    p = browser.new_page()
    yield p
    p.close()


def _rest(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def runs(server, tiny_study):
    """run id → (name, parent run id or None, tags) for the study, its model runs and their ablation runs."""
    ids = [
        tiny_study["study_run_id"],
        *(m.run_id for m in tiny_study["models"]),
        *tiny_study["ablations"].values(),
    ]
    out = {}
    for rid in ids:
        run = _rest(server["base"], f"/api/2.0/mlflow/runs/get?run_id={rid}")["run"]
        tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
        out[rid] = (run["info"]["run_name"], tags.get("mlflow.parentRunId"), tags)
    return out


def _shot(page, name: str, full_page: bool = False) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


def test_run_names_and_links_in_the_store(runs, tiny_study):
    """What the UI should show. Nesting is for browsing: a model trained before this study (reused by
    it) is not the study's child, but carries the study's id in its membership tag
    ``attnstudy.study.<study id>`` (docs/design.md §5)."""
    study = tiny_study["study_run_id"]
    assert runs[study][:2] == ("tiny/study", None)
    assert len(tiny_study["models"]) == 2
    for m in tiny_study["models"]:
        name, parent, tags = runs[m.run_id]
        assert name.startswith("copy/") and name.endswith("/seed1")
        assert parent in (study, None) and tags[f"attnstudy.study.{study}"].startswith("model ")
        aname, aparent, atags = runs[tiny_study["ablations"][m.run_id]]
        assert aname == f"ablations of {name}" and aparent == m.run_id
        assert atags["source_run_id"] == m.run_id and atags["study_id"] == study


def test_runs_view_shows_the_study_and_its_model_runs(server, runs, tiny_study, page):
    assert server["url"].endswith(f"/#/experiments/{server['exp_id']}/runs?{ui.RUNS_VIEW_QUERY}")
    page.goto(server["url"])
    page.get_by_text("tiny/study", exact=True).first.wait_for()
    page.wait_for_timeout(500)  # let the table settle for the screenshot
    _shot(page, "runs_view")
    # sorted by run name (the printed URL), every run is a row of its own: no expanding by hand
    # (sorted by creation time, MLflow nests a study's model runs under its collapsed row)
    for m in tiny_study["models"]:
        page.get_by_text(runs[m.run_id][0], exact=True).first.wait_for()
        page.get_by_text(f"ablations of {runs[m.run_id][0]}", exact=True).first.wait_for()
    page.wait_for_timeout(300)
    _shot(page, "runs_view_models")


@pytest.mark.parametrize("kind", ["study", "model", "ablation"])
def test_every_run_page_shows_the_run_its_parent_and_children(server, runs, tiny_study, page, kind):
    study = tiny_study["study_run_id"]
    ids = {
        "study": [study],
        "model": [m.run_id for m in tiny_study["models"]],
        "ablation": list(tiny_study["ablations"].values()),
    }[kind]
    for rid in ids:
        name, parent, tags = runs[rid]
        page.goto(f"{server['base']}/#/experiments/{server['exp_id']}/runs/{rid}")
        page.get_by_role("heading", name=name, exact=True).wait_for()
        page.get_by_text(rid, exact=True).first.wait_for()  # the overview's run ID
        # the overview lists "Parent run" then the parent's name, and "Child runs" then the children;
        # the tags link runs whatever the nesting (names and tags arrive after the page renders)
        expected = [f"Parent run\n{runs[parent][0]}"] if parent else []
        children = [c for c, (_, p, _) in runs.items() if p == rid]
        if children:
            expected += ["Child runs", *(runs[c][0] for c in children)]
        if kind != "study":
            expected.append(study)  # study_id / study_ids tag
        if "source_run_id" in tags:
            expected.append(tags["source_run_id"])
        try:
            page.wait_for_function(
                "texts => texts.every(t => document.body.innerText.includes(t))",
                arg=expected,
                timeout=20_000,
            )
        except PlaywrightTimeout:
            _shot(page, f"FAILED_run_{kind}_{name.replace('/', '_')}")
            body = page.inner_text("body")
            missing = [t for t in expected if t not in body]
            pytest.fail(f"run page of {name}: missing {missing}; page text: {body[:3000]}")
        _shot(page, f"run_{kind}_{name.replace('/', '_')}")


def test_figure_artifact_image_loads(server, tiny_study, page):
    study = tiny_study["study_run_id"]
    page.goto(
        f"{server['base']}/#/experiments/{server['exp_id']}/runs/{study}/artifacts/figures/permutation.png"
    )
    page.get_by_text("figures/permutation.png", exact=True).first.wait_for()
    img = page.locator(
        "img[src^='blob:']"
    ).first  # the artifact viewer shows the fetched file as a blob
    img.wait_for()
    page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=img.element_handle())
    width = img.evaluate("i => i.naturalWidth")
    assert width > 100
    _shot(page, "artifact_permutation")
    # and the file itself, as the UI fetches it
    got = page.evaluate(
        """async (url) => {
        const r = await fetch(url);
        const b = new Uint8Array(await r.arrayBuffer());
        return {status: r.status, type: r.headers.get('content-type'), head: Array.from(b.slice(0, 8))};
    }""",
        f"{server['base']}/get-artifact?path=figures/permutation.png&run_uuid={study}",
    )
    assert got["status"] == 200 and got["type"].startswith("image/png"), got
    assert bytes(got["head"]) == b"\x89PNG\r\n\x1a\n"


def test_report_html_images_load_and_tables_have_rows(tiny_study, page):
    report = Path(tiny_study["report"])
    page.goto(report.resolve().as_uri(), wait_until="load")
    images = page.evaluate("""() => Array.from(document.images).map(i => ({
        src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0}))""")
    assert images, "the report shows no image"
    assert all(i["ok"] for i in images), [i["src"] for i in images if not i["ok"]]
    # body rows: rows with a data cell (a header row has only <th>, wherever the markup puts it)
    tables = page.evaluate("""() => Array.from(document.querySelectorAll('table')).map(
        t => Array.from(t.rows).filter(r => r.querySelector('td')).length)""")
    assert tables, "the report has no table"
    assert all(n >= 1 for n in tables), tables
    _shot(page, "report", full_page=True)


# ----------------------------------------------------------------------------- inside MLflow's frame


def _artifact_frame(page, server, run_id: str, path: str):
    """Open ``path`` of ``run_id`` in MLflow's artifact viewer; the frame MLflow renders it in."""
    from attnstudy.report import Links

    page.goto(Links(server["base"], server["exp_id"]).artifact(run_id, path))  # as the report links
    page.get_by_text(path, exact=True).first.wait_for()
    page.locator("iframe").first.wait_for()
    handle = page.locator("iframe").first.element_handle()
    frame = handle.content_frame()
    frame.wait_for_load_state("load")
    return frame


def test_report_inside_mlflow_shows_every_image_and_a_verdict_per_model(server, tiny_study, page):
    study = tiny_study["study_run_id"]
    frame = _artifact_frame(page, server, study, "report/report.html")
    frame.wait_for_selector("#findings")
    frame.wait_for_function(
        "() => Array.from(document.images).every(i => i.complete)", timeout=20_000
    )
    images = frame.evaluate(
        """() => Array.from(document.images).map(i => ({
        src: i.getAttribute('src').slice(0, 30), w: i.naturalWidth}))"""
    )
    assert len(images) >= 6 and all(i["w"] > 100 for i in images), images
    findings = frame.evaluate(
        """() => Array.from(document.querySelectorAll('.finding')).map(d => ({
        model: d.dataset.model, text: d.querySelector('p.verdict').innerText}))"""
    )
    assert {f["model"] for f in findings} == {"copy additive-bahdanau", "copy none-bahdanau"}
    by_model = {f["model"]: f["text"] for f in findings}
    assert by_model["copy additive-bahdanau"].startswith("Attention is")
    assert by_model["copy none-bahdanau"].startswith("No attention")
    frame.locator("#findings").scroll_into_view_if_needed()
    _shot(page, "report_in_mlflow_findings")
    frame.locator("#figures").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    _shot(page, "report_in_mlflow_figures")


def test_experiment_opens_in_the_training_view(server, tiny_study, page):
    """The links attnstudy gives (the URL `attnstudy ui` prints, the report's links) open the
    training views. MLflow 3.17.2's UI takes the view from ``?workflowType=`` or the user's last
    choice (localStorage), default GenAI; it does not read the ``mlflow.experimentKind`` tag
    (set anyway: tests/tracking/test_run_pages.py), so every link carries the parameter."""
    from attnstudy.report import Links, ui_base_url

    assert "workflowType=machine_learning" in server["url"]
    page.goto(server["url"])
    try:
        page.get_by_text("tiny/study", exact=True).first.wait_for(timeout=30_000)
    except PlaywrightTimeout:
        _shot(page, "FAILED_experiment_training_view")
        pytest.fail(f"{page.url}: no runs table; page text: {page.inner_text('body')[:2000]}")
    assert "workflowType=machine_learning" in page.url and "/runs" in page.url, page.url
    page.wait_for_timeout(500)
    _shot(page, "experiment_training_view")
    # the report's link to the study run opens its run page in the same view
    links = Links(server["base"], server["exp_id"])
    page.goto(links.run(tiny_study["study_run_id"]))
    page.get_by_role("heading", name="tiny/study", exact=True).wait_for()
    assert "workflowType=machine_learning" in page.url, page.url
    assert ui_base_url(server["base"]) == server["base"]


def test_example_browser_inside_mlflow_lists_and_opens_examples(server, tiny_study, page):
    attn = next(m for m in tiny_study["models"] if m.spec.model.attention != "none")
    ablation = tiny_study["ablations"][attn.run_id]
    frame = _artifact_frame(page, server, ablation, "ablations/browser.html")
    frame.wait_for_selector("#examples tbody tr")
    rows = frame.locator("#examples tbody tr")
    assert rows.count() == 6  # ablation.n_examples of the tiny experiment
    assert frame.inner_text("#count") == "6 of 6 rows"
    # sortable: a numeric column sorts descending on the first click
    header = frame.locator("#examples thead th").nth(5)
    key = header.get_attribute("data-key")
    header.click()
    values = frame.evaluate(
        "k => Array.from(document.querySelectorAll('#examples tbody tr')).map("
        "tr => tr.children[5].innerText)",
        key,
    )
    nums = [float(v) for v in values if v not in ("–", "")]
    assert nums == sorted(nums, reverse=True), (key, values)
    rows.first.click()
    frame.wait_for_selector("#detail svg")
    maps = frame.evaluate(
        "() => Array.from(document.querySelectorAll('#detail .map h3')).map(h => h.innerText)"
    )
    assert any(m.startswith("attention") for m in maps) and "adversarial attention" in maps, maps
    assert frame.locator("#detail svg rect").count() > 10
    page.wait_for_timeout(300)
    _shot(page, "example_browser_in_mlflow")
    frame.locator("#detail .maps").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    _shot(page, "example_browser_in_mlflow_heatmaps")


# ----------------------------------------------------------------------------- fits at 1,400 px


@pytest.fixture(scope="module")
def golden_report(tmp_path_factory):
    """The committed golden study's report (tests/fixtures/golden), built into a fresh folder."""
    import importlib.util

    golden = ROOT / "tests" / "fixtures" / "golden"
    spec = importlib.util.spec_from_file_location("golden_build", golden / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("golden-ui")
    study = module.load(root)
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNSTUDY_ROOT", str(root))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        from attnstudy import api

        return api.report(study_id=study, out_dir=str(root / "report")).parent
    finally:
        mp.undo()


_FITS = """sel => {
  const t = document.querySelector(sel);
  const box = t.parentElement;
  const heads = t.querySelectorAll('thead th');
  return {scroll: box.scrollWidth, client: box.clientWidth, viewport: window.innerWidth,
          right: heads[heads.length - 1].getBoundingClientRect().right, columns: heads.length};
}"""


def test_report_used_table_fits_a_1400px_window(golden_report, page):
    """At 1,400 px the "Is attention used?" table scrolled sideways and hid its last columns
    (1,629 px wide in a 1,140 px column): its cells wrap now, and its last column is on screen."""
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto((golden_report / "report.html").as_uri(), wait_until="load")
    fit = page.evaluate(_FITS, 'table[data-question="used"]')
    assert fit["viewport"] == 1400 and fit["columns"] == 10
    assert fit["scroll"] <= fit["client"], fit
    assert fit["right"] <= 1400, fit
    _shot(page, "report_1400")


def test_example_browser_score_columns_are_on_screen_at_1400px(golden_report, page):
    """The example browser's score columns ran off screen (2,735 px of table in 1,350 px)."""
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto((golden_report / "examples" / "copy_transformer_L2H2.html").as_uri())
    page.wait_for_selector("#examples tbody tr")
    fit = page.evaluate(_FITS, "#examples")
    assert fit["columns"] >= 18  # the scores are there
    assert fit["scroll"] <= fit["client"], fit
    assert fit["right"] <= 1400, fit
    _shot(page, "example_browser_1400")


# ----------------------------------------------------------------------------- words, gold links


def _nt_fixture_transformer():
    """The NT fixture's splits, vocabularies and a seeded untrained 2-layer Transformer."""
    import torch

    from attnstudy.config import TransformerConfig, data_config
    from attnstudy.data import nt
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model

    fixture = ROOT / "tests" / "fixtures" / "nt"
    files = nt.NTFiles(
        fixture / "SBLGNT.tsv", fixture / "nt_BSB.tsv", fixture / "SBLGNT-BSB-manual.json"
    )
    splits = nt.build_splits(
        files, data_config(task=nt.TASK, nt_min_test_verses=0, nt_vocab_size=120)
    )
    sv, tv = (Vocab.build(getattr(e, side) for e in splits.train) for side in ("src", "tgt"))
    torch.manual_seed(0)
    mcfg = TransformerConfig(architecture="transformer", layers=2, heads=2, d_model=8, d_ff=16)
    return splits, sv, tv, build_model(mcfg, len(sv), len(tv)).eval()


def test_example_browser_shows_greek_and_english_words_with_gold_links(page, tmp_path):
    """An nt-greek-english example (John 1:2 of the committed fixture) opens on words: Greek
    words × English words with the verse's 7 gold links as boxes, the ablation's argmax links as
    dots, a table per English word; "subword tokens" shows the BPE grid with every subword cell
    of each linked word pair boxed."""
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.heatmaps import Recorder, gold_cells
    from attnstudy.analysis.suite import run_suite

    from attnstudy.pages.browser import browser_data, browser_html

    splits, sv, tv, model = _nt_fixture_transformer()
    cfg = AblationConfig(bootstrap_resamples=20, seed=3, ablations=["alignment", "permutation"])
    rec = Recorder(cfg.prefix)
    res = run_suite(model, splits.dev, sv, tv, cfg, progress=False, batch_size=4, recorder=rec)
    data = browser_data(rec.result(), res.table, meta={"title": "nt fixture", "prefix": "greedy"})
    path = tmp_path / "browser.html"
    path.write_text(browser_html(data), encoding="utf-8")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(path.as_uri() + "#ex=" + "nt%2Fdev%2F43001002")
    page.wait_for_selector("#detail svg")
    grid = page.locator('svg[data-map="attention on the reference, gold word links"]')
    labels = grid.locator("text").all_text_contents()
    english = ["He", "was", "with", "God", "in", "the", "beginning"]
    assert labels[:7] == english  # row labels first: the '.' is no word
    assert labels[7:] == ["οὗτος", "<unk>ν", "ἐν", "ἀρχ<unk>", "πρὸς", "τὸν", "θεόν"]
    boxes = grid.locator("rect.gold")
    assert boxes.count() == 7
    # each box sits on its link's cell: the cell's hover title names the two words
    cells = page.evaluate(
        """() => Array.from(document.querySelectorAll(
             'svg[data-map="attention on the reference, gold word links"] rect.gold')).map(g => {
             const x = +g.getAttribute('x') - 0.5, y = +g.getAttribute('y') - 0.5;
             const c = Array.from(g.parentNode.querySelectorAll('rect:not(.gold)')).find(
               r => +r.getAttribute('x') === x && +r.getAttribute('y') === y);
             return c.querySelector('title').textContent.split(':')[0]; })"""
    )
    assert sorted(cells) == sorted(
        [
            "He ← οὗτος",
            "was ← <unk>ν",
            "in ← ἐν",
            "the ← ἀρχ<unk>",
            "beginning ← ἀρχ<unk>",
            "with ← πρὸς",
            "God ← θεόν",
        ]
    )
    links = data["records"]["nt/dev/43001002"]["reference_words"]["links"]
    assert grid.locator("circle.link").count() == len(links) > 0
    assert page.locator("#reference-words tbody tr").count() == 7
    grid.scroll_into_view_if_needed()
    _shot(page, "example_browser_nt_words", full_page=True)
    page.select_option("#view", "tokens")
    sub = page.locator('svg[data-map="attention on the reference, gold links"]')
    ex = next(e for e in splits.dev if e.id == "nt/dev/43001002")
    assert sub.locator("rect.gold").count() == len(gold_cells(ex)) == 67
    assert page.locator("#reference-steps tbody tr").count() == len(ex.tgt) + 1  # <eos>
    _shot(page, "example_browser_nt_subwords", full_page=True)
    assert not errors, errors


def test_example_browser_on_translation_decodes_maps_numbers_layers_from_1_and_shows_the_error_rate(
    page, tmp_path
):
    """The page decodes its encoded maps (``decodeMap``/``decodeRecord``) to exactly the recorded
    values (and to what the plain ``browser.decode_record`` gives), numbers layers from 1 in the
    list and the layer switch, and for a translation task shows the token error rate instead of
    "correct?" (no "only incorrect" filter); a row clicked opens its example."""
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.heatmaps import Recorder
    from attnstudy.analysis.suite import run_suite

    from attnstudy.data import nt
    from attnstudy.data.tasks import TOKEN_ERROR_RATE
    from attnstudy.pages.browser import browser_data, browser_html, decode_record

    splits, sv, tv, model = _nt_fixture_transformer()
    cfg = AblationConfig(
        bootstrap_resamples=20, seed=3, ablations=["alignment", "permutation"], layers="each"
    )
    rec = Recorder(cfg.prefix)
    res = run_suite(model, splits.dev, sv, tv, cfg, progress=False, batch_size=4, recorder=rec)
    records = rec.result()
    data = browser_data(records, res.table, meta={"title": "nt layers"}, task=nt.TASK)
    path = tmp_path / "browser.html"
    path.write_text(browser_html(data), encoding="utf-8")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("#examples tbody tr")
    # every record decoded in the page: the recorded numbers, heads analysed jointly left out
    decoded = page.evaluate("ids => ids.map(id => decodeRecord(id))", [r["id"] for r in records])
    for original, got in zip(records, decoded):
        want = decode_record(data["records"][original["id"]])
        for key in ("attention", "reference_attention", "words", "reference_words"):
            assert got[key] == want[key], key
        assert got["attention"] == original["attention"]
        assert got["reference_attention"] == original["reference_attention"]
        assert got["words"]["attention"] == original["words"]["attention"]
        assert got["reference_words"]["attention"] == original["reference_words"]["attention"]
        assert "heads" not in got and "heads" in original  # the heads' mean only
    # the list: layers 1 and 2 (stored 0 and 1), the error rate, no "correct?"
    heads = page.locator("#examples thead th").all_text_contents()
    assert TOKEN_ERROR_RATE.label in heads and "correct?" not in heads, heads
    assert page.locator("#wrong").count() == 0
    layer_col = heads.index("layer")
    shown = page.evaluate(
        "c => Array.from(document.querySelectorAll('#examples tbody tr')).map("
        "tr => tr.children[c].innerText)",
        layer_col,
    )
    assert sorted(set(shown)) == ["1", "2"]
    assert sorted({row["layer"] for row in data["examples"]}) == [0, 1]
    # the error rate as computed (a column flagged like the layer's once showed value + 1)
    rate_col = heads.index(TOKEN_ERROR_RATE.label)
    cells = page.evaluate(
        "c => Array.from(document.querySelectorAll('#examples tbody tr')).map("
        "tr => [tr.dataset.id, tr.children[c].innerText])",
        rate_col,
    )
    rates = {row["id"]: row["token_error_rate"] for row in data["examples"]}
    assert all(rates.values())
    for eid, text in cells:
        assert text == page.evaluate("v => fmt(v)", rates[eid]), (eid, text, rates[eid])
    # a row clicked opens its example on its unit's layer (the last, stored 1), named 2
    page.locator("#examples tbody tr").first.click()
    page.wait_for_selector("#detail svg")
    assert page.locator("#layer option").all_text_contents() == ["layer 1", "layer 2"]
    assert page.input_value("#layer") == "1"
    titles = page.locator("#detail .map h3").all_text_contents()
    assert titles[0] == "attention between words (layer 2) (head mean)", titles
    # a hover shows the recorded weight: the first cell of the subword map of layer 1
    page.select_option("#view", "tokens")
    page.select_option("#layer", "0")
    first_id = page.locator("#examples tbody tr").first.get_attribute("data-id")
    first = next(r for r in records if r["id"] == first_id)
    cell = page.locator('svg[data-map="attention (layer 1) (head mean)"] rect title').first
    weight = first["attention"][0][0][0]  # 3 decimals, shown to 3 significant digits
    assert cell.text_content().endswith(": " + page.evaluate("v => fmt(v, 3)", weight))
    assert page.evaluate("v => fmt(v, 3)", 0.047) == "0.047"
    _shot(page, "example_browser_nt_layers", full_page=True)
    assert not errors, errors


# ----------------------------------------------------------------------------- texts read well


def _task_page(tmp_path, name: str, splits, task: str, n: int = 8) -> Path:
    """An example browser of an untrained small recurrent model on ``n`` test examples."""
    import torch
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.heatmaps import Recorder
    from attnstudy.analysis.suite import run_suite

    from attnstudy.config import ModelConfig
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model
    from attnstudy.pages.browser import browser_data, browser_html

    sv, tv = (Vocab.build(getattr(e, side) for e in splits.train) for side in ("src", "tgt"))
    torch.manual_seed(0)
    mcfg = ModelConfig(embedding_dim=8, encoder_hidden=8, decoder_hidden=16, attention_dim=8)
    model = build_model(mcfg, len(sv), len(tv)).eval()
    cfg = AblationConfig(
        bootstrap_resamples=20, seed=3, n_examples=n, ablations=["permutation", "importance"]
    )
    rec = Recorder(cfg.prefix)
    res = run_suite(model, splits.test[:n], sv, tv, cfg, progress=False, batch_size=8, recorder=rec)
    meta = {"title": name, "eps": 0.05, "n_permutations": 50}
    data = browser_data(rec.result(), res.table, examples=res.examples, meta=meta, task=task)
    path = tmp_path / f"{name}.html"
    path.write_text(browser_html(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def text_pages(tmp_path_factory):
    """Example browsers of a character task (dates: characters in, characters out), a word task
    (experiments/tsv-example: number words → digits) and Greek–English (the NT fixture's
    untrained Transformer: subword tokens shown as words)."""
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.heatmaps import Recorder
    from attnstudy.analysis.suite import run_suite

    from attnstudy.config import data_config
    from attnstudy.data import nt
    from attnstudy.data.tasks import load_task
    from attnstudy.pages.browser import browser_data, browser_html

    tmp = tmp_path_factory.mktemp("text-pages")
    tsv = ROOT / "experiments" / "data" / "tsv-example"
    paths = {
        "dates": _task_page(
            tmp, "dates", load_task(data_config(task="dates", n_train=200, n_test=20)), "dates"
        ),
        "tsv": _task_page(
            tmp,
            "tsv",
            load_task(
                data_config(
                    task="tsv",
                    alignment_base=0,
                    **{f"{s}_path": str(tsv / f"{s}.tsv") for s in ("train", "dev", "test")},
                )
            ),
            "tsv",
        ),
    }
    splits, sv, tv, model = _nt_fixture_transformer()
    cfg = AblationConfig(bootstrap_resamples=20, seed=3, ablations=["permutation", "importance"])
    rec = Recorder(cfg.prefix)
    res = run_suite(model, splits.dev, sv, tv, cfg, progress=False, batch_size=4, recorder=rec)
    meta = {"title": "nt fixture", "eps": 0.05, "n_permutations": 50}
    data = browser_data(rec.result(), res.table, meta=meta, task=nt.TASK)
    paths["nt"] = tmp / "nt.html"
    paths["nt"].write_text(browser_html(data), encoding="utf-8")
    return paths


# per token cell of the list: its text, whether it is a character task's (one string, one line),
# each token (a character task's cell: the whole text) that is broken over lines or wider than
# the cell's content box, and whether the cell's content runs past it
_TOKEN_CELLS = """() => Array.from(document.querySelectorAll('#examples td.tok')).map(td => {
  const node = td.firstChild, text = node ? node.textContent : "";
  const chars = td.classList.contains('chars');
  const cs = getComputedStyle(td);
  const inner = td.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  const units = [];
  if (chars) { if (text) units.push([0, text.length]); }
  else { let at = 0; for (const t of text.split(' ')) { if (t) units.push([at, at + t.length]); at += t.length + 1; } }
  const broken = [], wider = [];
  for (const [a, b] of units) {
    const r = document.createRange(); r.setStart(node, a); r.setEnd(node, b);
    const lines = Array.from(r.getClientRects()).filter(x => x.width > 0);
    if (lines.length !== 1) broken.push(text.slice(a, b));
    if (r.getBoundingClientRect().width > inner + 0.5) wider.push(text.slice(a, b));
  }
  return {col: td.dataset.col, text, chars, broken, wider, overflow: td.scrollWidth > td.clientWidth};
})"""

_SENTENCES = """() => Array.from(document.querySelectorAll('p.meta, p.note, #detail .map p'))
  .map(p => p.innerText)"""


@pytest.mark.parametrize(
    ("task", "kinds"),
    [
        ("dates", {"source": "chars", "target": "chars"}),
        ("tsv", {"source": "words", "target": "chars"}),
        ("nt", {"source": "words", "target": "words"}),
    ],
)
def test_example_browser_token_cells_fit_their_text_and_header_sentences_are_separate(
    text_pages, page, task, kinds
):
    """At 1,400 px no token cell is narrower than its text: no token is broken over lines (a
    character task's text is one line), none is wider than its cell; the header's sentences
    are separated ("(TVD).Permutation" ran together) and a map scaled per row gives its numbers
    no unit (the |gradient × input| panel said "(nats)")."""
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(text_pages[task].as_uri())
    page.wait_for_selector("#examples tbody tr")
    assert page.evaluate("() => DATA.text") == kinds
    cells = page.evaluate(_TOKEN_CELLS)
    assert len(cells) == 3 * page.locator("#examples tbody tr").count() > 0
    assert {c["col"] for c in cells if c["chars"]} == {
        col
        for col, side in (("source", "source"), ("reference", "target"), ("prediction", "target"))
        if kinds[side] == "chars"
    }
    bad = [c for c in cells if c["broken"] or c["wider"] or c["overflow"]]
    assert not bad, bad
    assert any(" " in c["text"] for c in cells if not c["chars"]) or task == "dates"
    _shot(page, f"example_browser_text_{task}")
    page.locator("#examples tbody tr").first.click()
    page.wait_for_selector("#detail svg")
    if task == "nt":
        page.select_option("#view", "tokens")  # the per-subword maps: gradient, LOO
    texts = page.evaluate(_SENTENCES)
    header = " ".join(texts[0].split())
    assert "within ε = 0.05 (TVD). Permutation scores use P = 50 random" in header, header
    for text in texts:
        assert not re.search(r"[^\s.]\.[A-Z]", text), text  # "word.Next" runs sentences together
    captions = [t for t in texts if "scaled so its largest is 1" in t]
    assert len(captions) == 2 and not any("(nats)" in t for t in captions), texts
    assert "hover a cell for the unscaled value, in nats" in captions[0]
    _shot(page, f"example_browser_text_{task}_open", full_page=True)
    assert not errors, errors
