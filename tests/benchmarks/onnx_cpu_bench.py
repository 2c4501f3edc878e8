# ONNX models timed in onnxruntime on the CPU (every core), one JSON line per model and batch:
#   B=1,32 python3 onnx_cpu_bench.py dense=dense.onnx small=small.onnx
# Random pixels in 0..255 (the export reads raw pixels); 3 warm-up runs, then at least 4 s.
import json, os, sys, time
import numpy as np, onnxruntime as ort
batches = [int(b) for b in os.environ.get("B", "1,32").split(",")]
for arg in sys.argv[1:]:
    name, path = arg.split("=")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    for b in batches:
        x = np.random.default_rng(0).uniform(0, 255, size=(b,) + tuple(inp.shape[1:])).astype(np.float32)
        for _ in range(3): sess.run(None, {inp.name: x})
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 4 or n < 5:
            sess.run(None, {inp.name: x}); n += 1
        dt = (time.perf_counter() - t0) / n
        print(json.dumps({"model": name, "batch": b, "ms": 1e3 * dt, "images_per_s": b / dt, "runs": n, "threads": os.cpu_count()}), flush=True)
