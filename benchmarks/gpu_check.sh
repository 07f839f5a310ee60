#!/usr/bin/env bash
# The prepared GPU check (issue #22 item 7), for a session that is lent a CUDA machine through
# the device tool. It runs the gpu-marked tests, then times a plain forward, capture and the
# heads/patching engines in float32 and bfloat16, then `headscope report --quick` on CUDA, then
# the per-architecture engine table of benchmarks/engine.py (issue #31 item 7) in bfloat16 and
# float32 at full sizes (6 layers x 768, 2,048 tokens; ENGINE_TOKENS=8192 for long context).
#
# Prepare here (no GPU needed), once, in the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl transformer-lens==4.3.0 captum better-abc typeguard fancy-einsum beartype datasets dill multiprocess
# (check `pip show` there first: its image has torch, transformers (5.17 on 2026-12-04, inside pyproject's range;
# a newer one would need a newer huggingface-hub too), tokenizers, numpy, pandas, matplotlib, seaborn,
# scikit-learn, safetensors, einops, jaxtyping... The MiniLM package, over the 64 MiB a call carries, is not
# needed: nothing below loads it.)
# Then run on the device, in one call (timeout 540 s), carrying .whl:
#   bash benchmarks/gpu_check.sh
set -uo pipefail
OUT="${OUT:-/tmp/gpu-out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
# The repo's folders install as headscope.* subpackages (pyproject's package-dir): an editable install without
# network or build isolation maps them. Where that fails, a sitecustomize on PYTHONPATH maps them by hand (a .pth
# file there would not be read: Python reads .pth files in site-packages only; 2026-12-04's run lost every check to it).
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>"$OUT/install_err.txt"; then
  mkdir -p /tmp/site
  python3 - <<'PY'
import pathlib
root = pathlib.Path.cwd()
mapping = {"headscope": root / "src/headscope", **{f"headscope.{p}": root / p
           for p in ("models", "hooks", "execution", "analyses", "probes", "reports")}}
pathlib.Path("/tmp/site/sitecustomize.py").write_text("import importlib.abc, importlib.util, sys\nM = %r\n" % {
    k: str(v) for k, v in mapping.items()} + '''
class F(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in M:
            return importlib.util.spec_from_file_location(name, M[name] + "/__init__.py", submodule_search_locations=[M[name]])
sys.meta_path.insert(0, F())
''')
PY
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
python3 -c "import headscope.analyses, headscope; print('headscope from', headscope.analyses.__file__)" | tee "$OUT/import.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt"
python3 - <<'PY' 2>&1 | tee "$OUT/gpu_timings.txt"
import time, torch, headscope as hs
from headscope.analyses.heads import importance as hi
for dtype in (torch.float32, torch.bfloat16):
    model = hs.load_model(device="cuda", dtype=dtype)
    task = hs.tasks.zoo(model, "kv", n_examples=256, seed=0)
    def timed(fn, n=5):
        fn(); torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize(); return (time.perf_counter() - t) / n
    fwd = timed(lambda: model(task.tokens))
    cap = timed(lambda: hs.capture(model, task.tokens, [hs.site("pattern", 1)]))
    grad = timed(lambda: hi.gradient_importance(model, task), 3)
    abl = timed(lambda: hi.ablation_importance(model, task, method="zero"), 3)
    print(f"{dtype}: forward {fwd*1e3:.1f} ms, capture {cap*1e3:.1f} ms, gate gradients {grad*1e3:.1f} ms, "
          f"zero ablation of 32 heads {abl*1e3:.1f} ms (256 examples)")
PY
for dtype in float32; do
  start=$(date +%s)
  python3 -m headscope report --quick --device cuda --out "$OUT/report-$dtype" -q > "$OUT/report_$dtype.txt" 2>&1
  echo "headscope report --quick on cuda ($dtype): exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_timings.txt"
done
# The engine table (issue #31 item 7): every architecture, bfloat16 first (what GPU users run), full sizes.
start=$(date +%s)
(cd benchmarks && timeout "${ENGINE_TIMEOUT:-400}" python3 engine.py --device cuda --dtypes bfloat16 float32 \
  --tokens "${ENGINE_TOKENS:-2048}" --repeats "${ENGINE_REPEATS:-3}" --threads 1) \
  > "$OUT/engine.txt" 2> "$OUT/engine_err.txt"
echo "benchmarks/engine.py on cuda: exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_timings.txt"
cat "$OUT/engine.txt"
