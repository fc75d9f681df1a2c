"""Time mla_prefill at bench_prefill's shapes under several launch configs, interleaved over rounds
(one process; the config order rotates each round so no config always runs first); cuDNN beside.
Each config's output is checked against the default config's on every shape first.

    PYTHONPATH=$PWD:$PWD/perf python3 perf/results/2026-11-30/session7/prefill_probe.py CFGS.json [ROUNDS]
CFGS.json: {"label": config-or-null, ...}; null = the arch's default.
"""

import json
import statistics
import sys

import torch
from bench_prefill import SHAPES, Case, Timer

cfgs = json.loads(open(sys.argv[1]).read())
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
dev = torch.device("cuda")
timer = Timer(graphs=True)
names = list(cfgs)
res = {}
for shape in SHAPES:
    case = Case(shape, dev)
    case.ours(None)
    ref = case.out.float().clone()
    for n in names:
        case.out.fill_(float("nan"))
        case.ours(cfgs[n])
        err = ((case.out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2 and not torch.isnan(case.out).any(), (shape.name, n, err)
    t = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t[n].append(timer("ours", lambda n=n: case.ours(cfgs[n])))
    cud = timer("cuDNN", case.cudnn) if hasattr(case, "cudnn") else float("nan")
    row = {n: shape.flops / (statistics.median(t[n]) * 1e-3) / 1e12 for n in names}
    row["cuDNN"] = shape.flops / (cud * 1e-3) / 1e12
    res[shape.name] = row
    print(shape.name, " ".join(f"{n}={v:.0f}" for n, v in row.items()), flush=True)
    del case
    torch.cuda.empty_cache()
print(json.dumps(res))
