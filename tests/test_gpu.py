"""The CUDA paths: tiny models loaded on the GPU against plain Hugging Face on the GPU, a bfloat16
load against float32, capture and head gates with CUDA tensors, CPU tokens moved to the model's
device. Every test here is marked `gpu` and skipped without CUDA (tests/conftest.py)."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from tests_support import hf_model, random_tokens

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
FAMILIES = ("gpt2", "llama", "neox")
FP32_TOL = 1e-4  # float32 on the GPU: of the logits' scale (max |logit|, at least 1); patterns absolutely
# bfloat16 keeps 8 mantissa bits (relative rounding 2^-9 per op); through the 2 tiny layers the logits
# stay within 5% of the float32 logits' scale (measured on CPU: 1% for gpt2 and neox, 2.1% for llama).
BF16_TOL = 5e-2


@pytest.fixture(scope="module")
def cuda_models(tiny_dirs):
    """The tiny models loaded on the GPU in float32 (shared; tests must not modify them)."""
    return {family: hs.load_model(path, device=DEVICE) for family, path in tiny_dirs.items()}


def _scale(x: torch.Tensor) -> float:
    return max(1.0, x.abs().max().item())


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_patterns_match_hugging_face_on_cuda(family, tiny_dirs, cuda_models):
    model = cuda_models[family]
    assert model.device.type == DEVICE
    tokens = random_tokens(2, 10).to(DEVICE)
    with torch.no_grad():
        ref = hf_model(tiny_dirs[family]).to(DEVICE)(tokens, output_attentions=True)
    names = [hs.site("pattern", layer) for layer in range(model.facts.n_layers)]
    acts = hs.capture(model, tokens, names)
    assert acts.output.device.type == DEVICE
    assert (acts.output - ref.logits).abs().max().item() <= FP32_TOL * _scale(ref.logits)
    for layer, name in enumerate(names):
        assert acts[name].device.type == DEVICE
        assert (acts[name] - ref.attentions[layer]).abs().max().item() <= FP32_TOL


def test_bfloat16_load_is_within_tolerance_of_float32(tiny_dirs, cuda_models):
    low = hs.load_model(tiny_dirs["llama"], device=DEVICE, dtype=torch.bfloat16)
    assert {p.dtype for p in low.bridge.parameters()} == {torch.bfloat16}
    tokens = random_tokens(2, 10)
    with torch.no_grad():
        ref = cuda_models["llama"](tokens)
        out = low(tokens)
    assert out.device.type == DEVICE and out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max().item() <= BF16_TOL * _scale(ref)


def test_capture_and_head_gates_work_on_cuda_and_remove_their_hooks(cuda_models):
    model = cuda_models["llama"]
    tokens = random_tokens(3, 6).to(DEVICE)
    name = hs.site("resid_post", 1)
    acts = hs.capture(model, tokens, [name])
    assert acts[name].device.type == DEVICE
    on_cpu = hs.capture(model, tokens, [name], to_cpu=True)
    assert on_cpu[name].device.type == "cpu" and torch.allclose(on_cpu[name], acts[name].cpu(), atol=1e-6)
    assert model.n_active_hooks() == 0

    with torch.no_grad():
        plain = model(tokens)
    with hs.head_gates(model) as gates:
        assert gates.device.type == DEVICE and model.n_active_hooks() > 0
        logits = model(tokens)
        (grad,) = torch.autograd.grad(logits[:, -1].log_softmax(-1)[:, 5].sum(), [gates])
    assert model.n_active_hooks() == 0
    assert torch.allclose(logits.detach(), plain, atol=1e-5)  # gates at one change nothing
    assert grad.device.type == DEVICE and grad.shape == (model.facts.n_layers, model.facts.n_heads)
    assert grad.abs().sum().item() > 0

    with pytest.raises(RuntimeError, match="boom"):  # removed on an exception too
        with hs.head_gates(model):
            raise RuntimeError("boom")
    assert model.n_active_hooks() == 0


def test_tokens_given_on_cpu_are_moved_to_the_models_device(cuda_models):
    model = cuda_models["gpt2"]
    tokens = random_tokens(2, 8)
    assert tokens.device.type == "cpu"
    with torch.no_grad():
        from_cpu = model(tokens)
        from_gpu = model(tokens.to(DEVICE))
    assert from_cpu.device.type == DEVICE
    assert torch.allclose(from_cpu, from_gpu, atol=1e-6)
    acts = hs.capture(model, tokens, [hs.site("pattern", 0)])
    assert acts[hs.site("pattern", 0)].device.type == DEVICE
    assert model.to_tokens("w1 w2 w3").device.type == DEVICE


def test_kv_eviction_and_circuit_edges_on_cuda_equal_the_cpu_runs(cuda_models, tiny_models):
    """2026-12-04's GPU check: `headscope report --device cuda` failed kv (the eviction sweep's answer step handed the
    model CPU tokens) and circuits' edge attribution (EAP-IG's interpolation weights on the CPU). Both on a CPU-token
    task, on the GPU, against the same runs on the CPU."""
    from headscope.analyses.circuits.edges import edge_scores
    from headscope.analyses.kv.eviction import eviction_sweep
    from tests_support import pair_task

    task = pair_task(n=4, n_pos=8)
    assert task.tokens.device.type == "cpu"
    runs = {where: (eviction_sweep(models["llama"], task, budgets=[2, 4], policies=("window",)),
                    edge_scores(models["llama"], task, ig_steps=2)[1])
            for where, models in (("cuda", cuda_models), ("cpu", tiny_models))}
    (sweep, scores), (sweep_cpu, scores_cpu) = runs["cuda"], runs["cpu"]
    assert len(sweep) == len(sweep_cpu) and (sweep["metric"] - sweep_cpu["metric"]).abs().max() <= 1e-3
    assert torch.allclose(scores.cpu(), scores_cpu, atol=1e-3)
