from fla_lab.lessons import amp, decay_contract as dc
c = amp.amp_step_comparison(T=512)
for n in ("fixed", "bug"):
    s = c[n]; print(n, s.device, s.dtypes, s.finite)
print("w bias", round(c["w bias max"], 5), round(c["w bias mean"], 5), [(t, round(e, 4)) for t, e in c["output drift"]])
for case in dc.RWKV7_CASES[:2]:
    print(dc.trace_rwkv7(case, T=64, K=64))
print(amp.debug_in_fp32())
