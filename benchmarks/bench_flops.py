"""Benchmark 4 — closeness to the limit: achieved FLOP rate of the permutation and adversarial
kernels as a fraction of ``torch.mm``'s rate on a 4096 × 4096 product.

FLOPs are counted analytically from the layer sizes (2·m·n·k per matrix product), for real
(non-padding) steps and valid source positions only, at the quickstart model sizes:

* per replacement row, forward: the context (2 · n_valid · context size), and the output layers
  of the flow — Bahdanau: GRU/LSTM cell (2 · (|W_ih| + |W_hh|)), readout (2 · |W_r|), output
  (2 · |W_o|); Luong (W_c's context half folded into the values, its state half computed once
  per step): the row's product with the projected values (2 · hidden per head and valid
  position) and the output (2 · |W_o|);
  Transformer (last layer analysed, W^O folded into the values): the row's product with the
  projected values (2 · d per head and valid position), the feed-forward and the output;
* adversarial backward (gradients w.r.t. the candidate weights only, parameters frozen): the
  input-gradient product of every layer on the path from the context to the loss — output,
  readout or combine, the cell's input weights (not W_hh: the prefix state needs no gradient) and
  the context (dα = dc · Vᵀ);
* the Bahdanau row form (the permutation kernel and the adversarial search) folds the context
  into the first RNN layer's input weights and the readout (:func:`search_layer_flops`): per row
  and direction, 2 · (gates + hidden) per head and valid position, the readout's state half and
  the output.

Kernels timed: the permutation kernel is the model calls of
``attnstudy.analysis.ablations.permutation.run`` on precomputed permutations (P = 100, and the
unchanged row as replacement P + 1): per chunk the model's row form of the local intervention
(``attnstudy.analysis._chunks.rows_given_attention``, prepared, then one call on the
(S, P + 1, H, T_x) rows), its FLOPs those of the row form (:func:`search_layer_flops`); the
adversarial kernel is
``search_adversarial`` (K = 5; per Adam iteration one forward + backward, plus the final
forward). Both use the thread count of the ``torch.mm`` measurement. Targets: ≥ 50 %
(permutation), ≥ 30 % (adversarial). A ``torch.profiler`` breakdown (self CPU time per operator)
says where the rest goes; "µs per row" compares kernels whatever their FLOP count.

Roofline (``benchmarks/roofline.py``, formula in docs/benchmarks.md): per kernel also
the compulsory bytes and transcendental calls, the machine's three peaks measured in the same
run (``torch.mm``, a 256 MiB copy, ``torch.tanh``/``torch.exp``), the bound
max(F/peak_F, M/peak_M, T/peak_T) and the fraction of it achieved; the traffic per operator
(dispatch-counted) beside it; and the whole permutation ablation's time over its kernel's.

Wants an idle machine: the fractions are judged only when the 1-minute load average stayed at
or below ``--idle-load`` (default: threads + 0.3) for the whole run, and flagged otherwise.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_flops [--smoke]``.
"""

from __future__ import annotations

import torch
from attnstudy.analysis._chunks import n_valid, rows_given_attention, sub_trace, trace_chunks
from attnstudy.analysis.ablations.adversarial import _searched_rows, search_adversarial
from attnstudy.analysis.ablations.permutation import run as run_permutation
from attnstudy.analysis.ablations.permutation import with_reference
from attnstudy.analysis.batch import AblationContext, step_streams
from attnstudy.analysis.interventions import permutation_index
from torch.profiler import ProfilerActivity, profile

from attnstudy.models import eval_mode

from . import common, roofline

TARGET_PERM = 0.50
TARGET_ADV = 0.30
TARGET_E2E = 1.3  # the whole permutation ablation over its kernel, at most


def layer_flops(model) -> dict[str, float]:
    """Per-row matmul FLOPs of the output layers, split into the parts the formulas need.

    Transformer (last layer analysed, W^O folded into the values): the feed-forward
    (2 · 2·d·d_ff) and the output projection (2·d·V) forward; backward (gradients w.r.t. the
    weights only) the same products; context 2·d per head and valid source position (the
    per-example product W^O_h v_hj, shared by every row, is not counted).

    Luong: the kernel folds W_c's context half into the values and computes its state half once
    per step (:meth:`Seq2Seq._luong_given_attention`), so a row costs the product of its attention
    row with the projected values (2 · hidden per head and valid position: ``context``) and the
    output layer (2·|W_o|); the per-step and per-example products it shares across the P rows
    (2·hidden² and 2·T_x·|W_ctx| per head) are not counted, which understates its rate slightly.
    """
    if getattr(model, "decoder_layers", None) is not None:
        top = model.decoder_layers[-1]
        ff = sum(m.weight.numel() for m in top.ff.net if isinstance(m, torch.nn.Linear))
        fwd = 2.0 * ff + 2.0 * model.output.weight.numel()
        # W^O folded into the values (Transformer._one_layer_given_attention): per head and valid
        # position, a d-wide product
        return {"forward": fwd, "backward": fwd, "context": 2.0 * model.heads * model.d_model}
    dec = model.decoder
    rnn = {n: p for n, p in dec.rnn.named_parameters() if n.startswith("weight")}
    w_ih = sum(p.numel() for n, p in rnn.items() if "weight_ih" in n)
    w_hh = sum(p.numel() for n, p in rnn.items() if "weight_hh" in n)
    out = 2.0 * dec.output.weight.numel()
    if dec.flow == "bahdanau":
        fwd = 2.0 * (w_ih + w_hh) + 2.0 * dec.readout.weight.numel() + out
        bwd = 2.0 * w_ih + 2.0 * dec.readout.weight.numel() + out
    else:
        # Luong: the RNN ran before the attention (its output is the prefix state); W_c folded
        heads = model.attention.heads
        return {"forward": out, "backward": out, "context": 2.0 * heads * dec.hidden}
    return {"forward": fwd, "backward": bwd, "context": 2.0 * model.attention.context_size}


def perm_work(bm, batches, cfg) -> tuple[list, float, int]:
    """What :func:`attnstudy.analysis.ablations.permutation.run` hands the model, precomputed:
    per chunk (sub-trace, its permuted steps' batch rows and steps, the (S, P + 1, H, T_x)
    replacement rows — the P permutations and the unchanged row), and their FLOPs (the row
    form's, :func:`search_layer_flops`) and row count (S · (P + 1))."""
    lf = search_layer_flops(bm.model)
    p_count = cfg.params_for("permutation").n
    cpu = torch.device("cpu")
    calls, flops, rows = [], 0.0, 0
    for batch in batches:
        tr, ids = batch.trace, batch.example_ids
        nv = n_valid(tr)
        for chunk in trace_chunks(tr, p_count + 1):
            idx = chunk.rows
            sub = sub_trace(tr, idx, chunk.start, chunk.stop)
            steps = sub.step_mask & (nv[idx] >= 2)[:, None]
            if not bool(steps.any()):
                continue
            streams = step_streams(  # the run's scheme (ablation.rng)
                AblationContext.of(cfg), [ids[i] for i in idx.tolist()], "permutation", chunk.start
            )
            sb, st, index, _ = permutation_index(
                (~sub.pad_mask).to(cpu), steps.to(cpu), p_count, sub.attention.size(1), streams
            )
            sb, st = sb.to(tr.src.device), st.to(tr.src.device)
            weights = with_reference(sub.attention[sb, :, st], index.to(tr.src.device))
            calls.append((sub, sb, st, weights))
            rows += sb.numel() * (p_count + 1)
            flops += float(((p_count + 1) * (lf["forward"] + lf["context"] * nv[idx][sb])).sum())
    return calls, flops, rows


def search_layer_flops(model) -> dict[str, float]:
    """Per-row FLOPs of the row form (``rows_given_attention``: the permutation kernel and the
    adversarial search): :func:`layer_flops`, except for the Bahdanau flow, whose row form
    (``Seq2Seq._bahdanau_rows``) folds the context into the first RNN layer's input weights and
    the readout and computes the recurrent and embedding terms once per row: a row costs one product of its attention row with the projected values (2 ·
    (gates + hidden) per head and valid position: ``context``), the readout's state half
    (2 · hidden²), the upper layers' input weights and the output (2·|W_o|), forward and
    backward alike (gradients w.r.t. the candidate weights only)."""
    lf = layer_flops(model)
    if getattr(model, "decoder_layers", None) is not None or model.decoder.flow != "bahdanau":
        return lf
    dec = model.decoder
    gates = dec.rnn.weight_ih_l0.size(0)
    upper = sum(getattr(dec.rnn, f"weight_ih_l{layer}").numel() for layer in range(1, dec.layers))
    per_row = 2.0 * dec.output.weight.numel() + 2.0 * dec.hidden * dec.hidden + 2.0 * upper
    context = 2.0 * (gates + dec.hidden) * model.attention.heads
    return {"forward": per_row, "backward": per_row, "context": context}


def adv_flops(bm, batches, iters: int, k: int) -> tuple[float, int]:
    lf = search_layer_flops(bm.model)
    flops, rows = 0.0, 0
    for batch in batches:
        b_idx, _ = _searched_rows(batch)
        nv = batch.trace.src_lengths[b_idx].double()
        n = len(b_idx)
        rows += n * k
        fwd = k * (n * lf["forward"] + float((lf["context"] * nv).sum()))
        bwd = k * (n * lf["backward"] + float((lf["context"] * nv).sum()))
        flops += (iters + 1) * fwd + iters * bwd
    return flops, rows


def profile_top(fn, n: int = 8) -> tuple[str, float]:
    """Self-CPU-time table of the top operators of one call, and the matmul share."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    mm_ops = {
        "aten::addmm",
        "aten::mm",
        "aten::bmm",
        "aten::matmul",
        "aten::linear",
        "aten::_addmm_activation",
        "aten::baddbmm",
    }
    mm = sum(e.self_cpu_time_total for e in events if e.key in mm_ops)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    rows = [
        {
            "operator": e.key,
            "calls": e.count,
            "self CPU ms": e.self_cpu_time_total / 1000.0,
            "share": f"{100.0 * e.self_cpu_time_total / total:.1f} %",
        }
        for e in events[:n]
    ]
    return common.table(rows), (mm / total if total else float("nan"))


def run(args) -> dict:
    n_words = 4 if args.smoke else 200
    n_adv = 2 if args.smoke else 32
    iters = 3 if args.smoke else 50
    p_count = 5 if args.smoke else 100
    mm_n = 512 if args.smoke else 4096
    repeats = args.repeats or (2 if args.smoke else 3)
    prefix = "reference" if args.smoke else "greedy"
    threads = torch.get_num_threads()
    peaks, peak_rates = roofline.measure_peaks(
        mm_n=mm_n,
        copy_mib=16 if args.smoke else 256,
        trans_n=2**20 if args.smoke else 2**24,
        threads=threads,
        repeats=2 if args.smoke else 3,
    )
    peak = peaks.flops
    cfg = common.ablation_cfg(n_permutations=p_count, seed=0)
    rows, roof, sections, notes, out = [], [], [], [], {}
    for flow in common.kernels(args):
        bm = common.get_model(args, flow)
        notes.append(f"model {flow}: {bm.origin}")
        batches = common.prepared(bm, max(n_words, n_adv), prefix, batch_size=32)
        perm_batches = (
            common.prepared(bm, n_words, prefix, batch_size=32)
            if n_words != max(n_words, n_adv)
            else batches
        )
        adv_batches = (
            common.prepared(bm, n_adv, prefix, batch_size=32)
            if n_adv != max(n_words, n_adv)
            else batches
        )
        calls, p_flops, p_rows = perm_work(bm, perm_batches, cfg)
        model = bm.model

        def perm_kernel(calls=calls, model=model):
            with eval_mode(model), torch.no_grad():
                return [
                    rows_given_attention(model, s, sb, st, cfg.chunk_rows)(w)
                    for s, sb, st, w in calls
                ]

        def perm_end_to_end(model=model, perm_batches=perm_batches):
            return [
                run_permutation(model, b, cfg.params_for("permutation"), AblationContext.of(cfg))
                for b in perm_batches
            ]

        def adv_kernel(model=model, adv_batches=adv_batches):
            return [
                search_adversarial(
                    model, b, cfg.params_for("adversarial"), AblationContext.of(cfg), steps=iters
                )
                for b in adv_batches
            ]

        a_flops, a_rows = adv_flops(bm, adv_batches, iters, cfg.params_for("adversarial").k)
        res = common.interleaved(
            {"perm": perm_kernel, "perm_e2e": perm_end_to_end, "adv": adv_kernel}, repeats
        )
        inputs = {"perm": (calls, model), "perm_e2e": (perm_batches, model)}
        inputs["adv"] = (adv_batches, model)
        for name, label, fl, nrows in (
            ("perm", "permutation kernel", p_flops, p_rows),
            ("perm_e2e", "permutation, whole ablation", p_flops, p_rows),
            ("adv", "adversarial search", a_flops, a_rows),
        ):
            rate = fl / res[name].best
            rows.append(
                {
                    "flow": flow,
                    "kernel": label,
                    "rows": nrows,
                    "GFLOP": fl / 1e9,
                    "best s": res[name].best,
                    "µs per row": 1e6 * res[name].best / max(nrows, 1),
                    "GFLOP/s": rate / 1e9,
                    "fraction of mm": rate / peak,
                }
            )
            out[(flow, name)] = rate / peak
            fn = {"perm": perm_kernel, "perm_e2e": perm_end_to_end, "adv": adv_kernel}[name]
            ops, result = roofline.count_ops(fn)
            nbytes = roofline.compulsory_bytes(*inputs[name], result)
            trans = ops.total_transcendentals
            b = roofline.bound(fl, nbytes, trans, peaks)
            roof.append(
                {
                    "flow": flow,
                    "kernel": label,
                    "rows": nrows,
                    "GFLOP": fl / 1e9,
                    "MB": nbytes / 1e6,
                    "transcendentals (M)": trans / 1e6,
                    "bound": b.limit,
                    "bound s": b.seconds,
                    "best s": res[name].best,
                    "fraction of bound": b.seconds / res[name].best,
                }
            )
            out[(flow, name, "roofline")] = b.seconds / res[name].best
            sections.append(
                (f"{flow}: {label}, traffic per operator (dispatch-counted)", ops.table())
            )
        ratio = res["perm_e2e"].best / res["perm"].best
        out[(flow, "e2e_ratio")] = ratio
        t_perm, mm_share_p = profile_top(perm_kernel)
        t_adv, mm_share_a = profile_top(adv_kernel)
        sections.append(
            (
                f"{flow}: permutation kernel, top operators (matmul share {100 * mm_share_p:.0f} %)",
                t_perm,
            )
        )
        sections.append(
            (
                f"{flow}: adversarial search, top operators (matmul share {100 * mm_share_a:.0f} %)",
                t_adv,
            )
        )
    sections.insert(0, ("", common.table(rows)))
    sections.insert(
        1,
        (
            "Roofline: bound = max(FLOPs / peak FLOP/s, bytes / peak bytes/s, transcendentals / "
            "peak transcendentals/s); fraction = bound / best time",
            common.table(roof),
        ),
    )
    idle = common.LOAD.idle(args.idle_load)
    judge = common.verdict if idle else (lambda *_, **__: "not judged: the machine was not idle")
    for flow in common.kernels(args):
        if (flow, "e2e_ratio") not in out:
            continue
        fp, fa = out[(flow, "perm", "roofline")], out[(flow, "adv", "roofline")]
        ratio = out[(flow, "e2e_ratio")]
        notes.append(
            f"{flow}: permutation kernel {100 * fp:.1f} % of its roofline bound (target ≥ 50 %, "
            f"{judge(fp, TARGET_PERM)}); adversarial search {100 * fa:.1f} % (target ≥ 30 %, "
            f"{judge(fa, TARGET_ADV)}); whole permutation ablation / kernel = {ratio:.2f} "
            f"(target ≤ 1.3, {judge(ratio, TARGET_E2E, higher_is_better=False)}); "
            f"{100 * out[(flow, 'perm')]:.1f} % and {100 * out[(flow, 'adv')]:.1f} % of mm"
        )
    notes.append(common.load_note(args))
    notes.append(
        "FLOPs count useful work only (real steps, valid source positions); the context product "
        "also runs over padding steps and positions, and the elementwise gate/softmax/Adam work "
        "is not counted: the profiler tables show where that time goes"
    )
    if args.smoke:
        notes.append(
            f"smoke mode: mm measured at {mm_n}³ and tiny kernels; the fractions say nothing about the targets"
        )
    common.report(
        "Closeness to the limit: kernel FLOP rate vs torch.mm",
        args,
        {
            "mm size": mm_n,
            **peak_rates,
            "threads": threads,
            "permutation words": n_words,
            "P": p_count,
            "adversarial words": n_adv,
            "K": cfg.params_for("adversarial").k,
            "Adam iterations": iters,
            "prefix": prefix,
            "timing": f"best of {repeats} interleaved",
        },
        sections,
        notes,
    )
    return {
        "rows": rows,
        "roofline": roof,
        "peaks": peaks,
        "fractions": {k: v for k, v in out.items() if k[1] != "e2e_ratio"},
        "e2e_ratios": {k[0]: v for k, v in out.items() if k[1] == "e2e_ratio"},
        "mm_rate": peak,
        "idle": idle,
    }


def main(argv=None) -> dict:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
