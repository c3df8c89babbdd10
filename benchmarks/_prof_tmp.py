import argparse, time, torch
from benchmarks import common
a = argparse.Namespace(smoke=True, model_uri=None)
def t(fn, n=5):
    fn(); best=1e9
    for _ in range(n):
        t0=time.perf_counter(); fn(); best=min(best, time.perf_counter()-t0)
    return round(best*1000, 2)
bm = common.get_model(a, "bahdanau"); d = bm.model.decoder
N = 4096; H=128; E=32; C=128
torch.manual_seed(0)
prefix = torch.randn(N, H+E); ctx = torch.randn(N, C)
with torch.no_grad():
    emb = prefix[:, H:]; st = prefix[:, :H]
    x = torch.cat([emb, ctx], -1)
    h0 = st.view(N, 1, H).transpose(0, 1)
    s, _ = d._run_rnn(x, h0)
    r_in = torch.cat([s, ctx, emb], -1)
    hid = torch.tanh(d.readout(r_in))
    res = {
     "whole output_given_context": t(lambda: d.output_given_context(prefix, ctx)),
     "cat x": t(lambda: torch.cat([emb, ctx], -1)),
     "gru step (nn.GRU)": t(lambda: d._run_rnn(x, h0)),
     "gru matmuls only (x W_ih^T + h W_hh^T)": t(lambda: (torch.addmm(d.rnn.bias_ih_l0, x, d.rnn.weight_ih_l0.t()), torch.addmm(d.rnn.bias_hh_l0, st, d.rnn.weight_hh_l0.t()))),
     "gru cell (torch.gru_cell)": t(lambda: torch.gru_cell(x, st.contiguous(), d.rnn.weight_ih_l0, d.rnn.weight_hh_l0, d.rnn.bias_ih_l0, d.rnn.bias_hh_l0)),
     "cat readout in": t(lambda: torch.cat([s, ctx, emb], -1)),
     "readout linear+tanh": t(lambda: torch.tanh(d.readout(r_in))),
     "output linear": t(lambda: d.output(hid)),
    }
    for k, v in res.items(): print(f"{k:45s} {v} ms")
    fl = 2*N*(384*288 + 128*288 + 43*128)
    print("GFLOP/s whole", fl/res["whole output_given_context"]/1e6, "mm4096? skip; mm1024", common.mm_rate(1024)/1e9)
