"""The example browser on a translation-sized run: where the page's bytes go, and how long
headless Chromium takes to show its list and to open an example.

The run (:func:`translation_run`) is built, not trained: the record format of
:class:`attnstudy.analysis.heatmaps.Recorder` on the reference prefix of a 3-layer, 4-head
Transformer (the per-layer Greek–English study: ``ablation.layers = "each"``, heads jointly),
with subword tokens grouped into words (``word_view``, ``reference_word_view`` of the same
module), gold word links, the per-step table of permutation, uniform, erase-max and alignment
per layer, and test predictions. Attention rows are random (Dirichlet, α = 0.2: most weights
small, as trained models' are), rounded to 3 decimals as the recorder rounds them. The sizes
are the real study's: 300 verses, about 25 source and 40 target subwords.

Bytes are deterministic and held by ``tests/analysis/test_browser_size.py``; times are printed
for information (one machine, one load), never asserted.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_browser [--examples 300] [--repeats 3]``
(needs Playwright and ``/usr/bin/chromium``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

CHROMIUM = "/usr/bin/chromium"


def _rounded(m: np.ndarray) -> list:
    """To 3 decimals, as the recorder keeps them (each value the double nearest k / 1000),
    nested."""
    return np.round(m, 3).tolist()


def _words(rng: np.random.Generator, n_tokens: int, prefix: str, punctuation: float) -> tuple:
    """``n_tokens`` subword tokens marked ``▁`` at word starts, and the word of each (−1: a
    punctuation token, which is no word)."""
    letters = list("αβγδεζηθικλμνξοπρστυφχψω") if prefix == "grc" else list("abcdefghilmnorstuw")
    tokens, words, w = [], [], -1
    for i in range(n_tokens):
        if i > 0 and rng.random() < punctuation:
            tokens.append("▁" + rng.choice([",", ".", ";"]))
            words.append(-1)
            continue
        start = i == 0 or words[-1] < 0 or rng.random() < 0.6
        w += int(start)
        body = "".join(rng.choice(letters, size=int(rng.integers(2, 6))))
        tokens.append(("▁" if start else "") + body)
        words.append(w)
    return tuple(tokens), tuple(words)


def translation_run(
    n_examples: int = 300,
    *,
    src_len: int = 25,
    tgt_len: int = 40,
    layers: int = 3,
    heads: int = 4,
    seed: int = 0,
) -> tuple[list[dict], pd.DataFrame, pd.DataFrame]:
    """A per-layer ablation run of a translation model as the browser receives it.

    Args:
        n_examples: analysed examples (verses).
        src_len, tgt_len: mean source / target subword tokens per example (± 40 %).
        layers, heads: the Transformer's decoder layers and heads per layer.
        seed: the random draw.

    Returns:
        ``(records, steps, predictions)``: :func:`attnstudy.analysis.heatmaps.example_records`
        style records (prefix ``reference``, analysed unit the last layer, heads jointly), the
        per-step table (every layer, head −1) and the model's test predictions.
    """
    import torch
    from attnstudy.analysis.heatmaps import gold_cells, reference_word_view, word_view

    from attnstudy.data.alignment import Alignment
    from attnstudy.data.types import Example

    rng = np.random.default_rng(seed)
    records, step_rows, preds = [], [], []
    for e in range(n_examples):
        n_x = max(3, int(src_len * rng.uniform(0.6, 1.4)))
        n_y = max(3, int(tgt_len * rng.uniform(0.6, 1.4)))
        src, src_words = _words(rng, n_x, "grc", 0.0)
        tgt, tgt_words = _words(rng, n_y, "en", 0.08)
        n_sw, n_tw = max(src_words) + 1, max(tgt_words) + 1
        links = {(int(rng.integers(n_sw)), t) for t in range(n_tw) if rng.random() < 0.8}
        ex = Example(
            f"nt/test/{40000000 + e}",
            src,
            tgt,
            alignment=Alignment(frozenset(links), frozenset(links)),
            src_words=src_words,
            tgt_words=tgt_words,
        )
        rows = [*tgt, "<eos>"]
        t = len(rows)
        att = torch.tensor(rng.dirichlet(np.full(n_x, 0.2), size=(layers, heads, t)))
        rec = {
            "id": ex.id,
            "source": list(src),
            "reference": list(tgt),
            "prefix": "reference",
            "steps": list(range(t)),
            "rows": rows,
            "p": [round(float(v), 3) for v in rng.uniform(0, 1, t)],
            "layer": layers - 1,
            "head": -1,
            "attention": _rounded(att.mean(1).numpy()),
            "heads": _rounded(att.numpy()),
            "words": word_view(ex, rows, att, "reference"),
            "reference_rows": rows,
            "reference_attention": _rounded(att[layers - 1].mean(0).numpy()),
            "gold": gold_cells(ex),
            "reference_words": reference_word_view(ex, att[layers - 1]),
        }
        records.append(rec)
        gold = {(s, w) for s, w in links}
        for layer in range(layers):
            first = set()
            for step in range(t):
                word = tgt_words[step] if step < len(tgt_words) else -1
                is_first = word >= 0 and word not in first
                first.add(word)
                flips = rng.random(4) < 0.2
                step_rows.append(
                    {
                        "example_id": ex.id,
                        "prefix": "reference",
                        "step": step,
                        "layer": layer,
                        "head": -1,
                        "permutation_flip_rate": float(rng.random() * 0.5),
                        "permutation_median_tvd": float(rng.random() * 0.3),
                        "uniform_flip": float(flips[0]),
                        "uniform_tvd": float(rng.random() * 0.3),
                        "erase_max_flip": float(flips[1]),
                        "alignment_word": word if is_first else -1,
                        "alignment_gold_mass": float(rng.random()) if is_first else np.nan,
                        "alignment_argmax_on_gold": float(flips[2]) if is_first else np.nan,
                        "alignment_n_hyp": 1.0 if is_first else np.nan,
                        "alignment_n_sure": float(any(w == word for _, w in gold))
                        if is_first
                        else np.nan,
                        "alignment_n_hyp_sure": float(flips[2]) if is_first else np.nan,
                        "alignment_n_hyp_possible": float(flips[2]) if is_first else np.nan,
                    }
                )
        hyp = list(tgt[: max(1, n_y - 3)])
        preds.append(
            {
                "example_id": ex.id,
                "hypothesis": " ".join(hyp),
                "correct": False,
                "edit_distance": n_y - len(hyp) + int(rng.integers(0, 10)),
                "reference_length": n_y,
            }
        )
    return records, pd.DataFrame(step_rows), pd.DataFrame(preds)


def page_of(records, steps, predictions, task: str = "nt-greek-english") -> str:
    """The browser page of a run (``prefix`` reference, as the Greek–English study ran)."""
    from attnstudy.pages.browser import browser_data, browser_html

    data = browser_data(
        records,
        steps,
        predictions=predictions,
        meta={"title": "bench", "prefix": "reference"},
        task=task,
    )
    return browser_html(data)


def embedded(page: str) -> dict:
    """The page's embedded JSON."""
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def bytes_by_key(page: str) -> Counter:
    """Bytes of the page's JSON per key (a record's keys summed over records, ``view.key`` for
    the word views)."""
    data = embedded(page)
    size = lambda o: len(json.dumps(o, ensure_ascii=False, separators=(",", ":")).encode())  # noqa: E731
    out = Counter({k: size(v) for k, v in data.items() if k != "records"})
    for rec in data["records"].values():
        for k, v in rec.items():
            if isinstance(v, dict) and k in ("words", "reference_words"):
                for kk, vv in v.items():
                    out[f"records.{k}.{kk}"] += size(vv)
            else:
                out[f"records.{k}"] += size(v)
    return out


def time_page(path: Path, repeats: int) -> list[dict]:
    """Seconds until the list is drawn (rows and count), to open the second row's example, and
    to switch its layer, per repeat (a fresh page each time)."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for _ in range(repeats):
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.set_default_timeout(600_000)
                errors: list[str] = []
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                t0 = time.perf_counter()
                page.goto(path.resolve().as_uri(), wait_until="commit")
                page.wait_for_selector("#examples tbody tr")
                page.wait_for_function("() => document.getElementById('count').textContent")
                listed = time.perf_counter() - t0
                t1 = time.perf_counter()
                page.locator("#examples tbody tr").nth(1).click()
                page.wait_for_selector("#detail svg")
                opened = time.perf_counter() - t1
                t2 = time.perf_counter()
                if page.locator("#layer").count():
                    page.select_option("#layer", index=0)
                    page.wait_for_selector("#detail svg")
                switched = time.perf_counter() - t2
                out.append(
                    {"list_s": listed, "open_s": opened, "layer_s": switched, "errors": errors}
                )
                page.close()
        finally:
            browser.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page", type=Path, default=None, help="time this page instead of building one")
    args = p.parse_args(argv)
    print(f"load average: {os.getloadavg()}")
    if args.page is None:
        page = page_of(*translation_run(args.examples))
        by_key = bytes_by_key(page)
        print(f"page: {len(page.encode()):,} bytes; embedded JSON by key:")
        for k, v in by_key.most_common():
            print(f"  {k:40s} {v:>12,}")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "browser.html"
            path.write_text(page, encoding="utf-8")
            runs = time_page(path, args.repeats)
    else:
        print(f"page: {args.page.stat().st_size:,} bytes")
        runs = time_page(args.page, args.repeats)
    for r in runs:
        print(
            f"list drawn {r['list_s']:.2f} s, example opened {r['open_s']:.2f} s, "
            f"layer switched {r['layer_s']:.2f} s, page errors: {r['errors'] or 'none'}"
        )
    print(f"load average: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
