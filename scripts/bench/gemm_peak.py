"""fp32 GEMM peak of this torch build on both of its CPU GEMM libraries: BLAS (torch.mm, MKL in the
PyPI wheel) and oneDNN (torch.ops.mkldnn._linear_pointwise, the primitive mmpost's
cpu_gemm="onednn" runs). n x n matrices, GFLOP/s = 2 n^3 / s, median of --repeats timed calls
after 2 warm-up calls, for each path, thread count and size; the two paths are timed alternately
call by call. peak_gflops is the best of both paths (the chip's measured fp32 peak);
peak_by_path keeps each. Prints one JSON line."""
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

paths = {"blas": lambda x, y, z: torch.mm(x, y.t(), out=z)}
if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
    paths["onednn"] = lambda x, y, z: torch.ops.mkldnn._linear_pointwise(x, y, None, "none", [], "")

res = {name: {} for name in paths}
for th in a.threads:
    torch.set_num_threads(th)
    for n in a.sizes:
        x, y, z = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        ts = {name: [] for name in paths}
        for name, f in paths.items():
            for _ in range(2):
                f(x, y, z)
        for _ in range(a.repeats):
            for name, f in paths.items():
                t = time.perf_counter()
                f(x, y, z)
                ts[name].append(time.perf_counter() - t)
        for name in paths:
            res[name][f"{th}:{n}"] = 2 * n**3 / statistics.median(ts[name]) / 1e9
by_path = {name: {th: max(v for k, v in r.items() if k.startswith(f"{th}:")) for th in a.threads}
           for name, r in res.items()}
peak = {th: max(by_path[name][th] for name in by_path) for th in a.threads}
cfg = torch.__config__.show()
print(json.dumps({"gflops": res["blas"], "gflops_by_path": res, "peak_gflops": peak,
                  "peak_by_path": by_path, "mkldnn": torch.backends.mkldnn.is_available(),
                  "blas": cfg.split("BLAS_INFO=")[1].split(",")[0] if "BLAS_INFO=" in cfg else "?"}))
