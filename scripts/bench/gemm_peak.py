"""fp32 GEMM peak of this torch build: torch.mm of n x n matrices, GFLOP/s = 2 n^3 / s, median of
--repeats timed calls after 2 warm-up calls, for each thread count and size. Prints one JSON line."""
import argparse
import json
import statistics
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 3072])
p.add_argument("--repeats", type=int, default=7)
a = p.parse_args()
res = {}
for th in a.threads:
    torch.set_num_threads(th)
    for n in a.sizes:
        x, y, z = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        for _ in range(2):
            torch.mm(x, y, out=z)
        ts = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            torch.mm(x, y, out=z)
            ts.append(time.perf_counter() - t)
        res[f"{th}:{n}"] = 2 * n**3 / statistics.median(ts) / 1e9
peak = {th: max(v for k, v in res.items() if k.startswith(f"{th}:")) for th in a.threads}
print(json.dumps({"gflops": res, "peak_gflops": peak, "mkldnn": torch.backends.mkldnn.is_available(),
                  "blas": torch.__config__.show().split("BLAS_INFO=")[1].split(",")[0]
                  if "BLAS_INFO=" in torch.__config__.show() else "?"}))
