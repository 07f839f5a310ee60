"""Shared test configuration: offline hub, tiny random models built locally, the shipped zoo model,
CUDA marker."""
from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HEADSCOPE_THREADS", "1")  # tiny models: one thread (models/threads.py), CLI runs too

import pytest  # noqa: E402
import torch  # noqa: E402

from tests_support import build_tiny_model  # noqa: E402

# Tests run tiny models, whose matmuls are too small to gain from threads; one thread avoids
# oversubscribing the 2-core CI machine.
torch.set_num_threads(1)


# The files that take longest (a minute or more on 2 cores), longest first: pytest-xdist hands whole
# files to its workers in collection order (pyproject.toml's addopts), so these start first and the
# short files fill the gaps, instead of one long file running alone at the end.
LONG_FILES = (
    "tests/test_cli.py", "tests/test_mixed_length_report.py", "tests/test_matrix_report.py",
    "tests/reports/test_minilm_report.py", "tests/test_distributed.py", "tests/reports/test_figures.py",
    "tests/test_faults.py", "tests/analyses/test_attribution.py", "tests/analyses/test_circuits_zoo.py",
    "tests/analyses/test_probes_zoo.py", "tests/reports/test_contract_report.py", "tests/test_examples.py",
    "tests/test_report_browser.py", "tests/analyses/test_continuation.py",
)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most 4 (each holds its own copies of
    the session's test models)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONG_FILES)))  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Local HF directories of tiny random models: {"gpt2": path, "llama": path, "neox": path}."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: build_tiny_model(family, root / family) for family in ("gpt2", "llama", "neox")}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    """HookedModels loaded from the tiny directories (shared; tests must not modify them)."""
    import headscope as hs

    return {family: hs.load_model(path, device="cpu") for family, path in tiny_dirs.items()}


@pytest.fixture(scope="session")
def zoo_model():
    """The shipped zoo/synth-llama on CPU, loaded once for the slow zoo tests (shared; tests must not
    modify it). Never skipped: the zoo checkpoints ship with the package, so a failure to load is a
    packaging bug."""
    import headscope as hs

    return hs.load_model("zoo/synth-llama", device="cpu")


@pytest.fixture(scope="session")
def arch_dirs(tmp_path_factory):
    """The architecture matrix (#19), built once: {arch: directory} for every key of
    tests_support.ARCHITECTURES (random weights, a real-style tokenizer trained on English)."""
    from tests_support import ARCHITECTURES, build_architecture

    root = tmp_path_factory.mktemp("arch-matrix")
    return {arch: build_architecture(arch, root / arch) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def more_arch_dirs(tmp_path_factory):
    """arch -> directory for tests_support.MORE_ARCHITECTURES (OLMo 2, Qwen3, Gemma 3, Mixtral, Cohere2, Exaone4,
    Qwen2-MoE), each built on first use and shared."""
    import functools

    from tests_support import build_architecture

    root = tmp_path_factory.mktemp("more-archs")
    return functools.cache(lambda arch: build_architecture(arch, root / arch))


@pytest.fixture(scope="session")
def mixed_moe_dir(more_arch_dirs, tmp_path_factory):
    """A Qwen2-MoE whose layer 0 is a dense MLP (mlp_only_layers=[0]) before a mixture of experts with a shared
    expert (layer 1), as Qwen2/3-MoE's mlp_only_layers and DeepSeek's first_k_dense_replace lay them out; random
    weights (seed 0), the qwen2moe tokenizer."""
    import transformers

    from tests_support import save_random_checkpoint

    source, out = more_arch_dirs("qwen2moe"), tmp_path_factory.mktemp("mixed-moe") / "mixed"
    config = transformers.AutoConfig.from_pretrained(source)
    config.mlp_only_layers = [0]
    save_random_checkpoint(config, out, source)
    return out


@pytest.fixture(scope="session")
def opt_model(tmp_path_factory):
    """(HookedModel, its directory) of tests_support's tiny "opt" family (seed 0), built once: a model whose
    attention TransformerLens hands to Hugging Face, so edits to scores and patterns are discarded (review 16d)."""
    import headscope as hs

    path = build_tiny_model("opt", tmp_path_factory.mktemp("opt") / "opt")
    return hs.load_model(str(path), device="cpu"), path


@pytest.fixture(scope="session")
def bloom_model(tmp_path_factory):
    """(HookedModel, its directory) of tests_support's tiny "bloom" family (ALiBi), built once for the ALiBi tests
    (analyses/test_alibi.py, analyses/test_edges_mlp_in.py, execution/test_resume.py; tests must not modify it).
    Seed 5: test_edges_mlp_in needs a BLOOM above chance on tests_support.pair_task (seed 0 is at chance)."""
    import headscope as hs

    path = build_tiny_model("bloom", tmp_path_factory.mktemp("bloom") / "bloom", seed=5)
    return hs.load_model(str(path), device="cpu"), path


@pytest.fixture(scope="session")
def gpt_neo_model(tmp_path_factory):
    """(HookedModel, its directory) of tests_support's tiny "gpt_neo" family (seed 0), built once: layer 1 local
    with window_size 4 (GPT-Neo's attention_layers, not sliding_window; review 17d), a delegating bridge as OPT."""
    import headscope as hs

    path = build_tiny_model("gpt_neo", tmp_path_factory.mktemp("gpt_neo") / "gpt_neo")
    return hs.load_model(str(path), device="cpu"), path


@pytest.fixture(scope="session")
def deepseek_v3_dir(tmp_path_factory):
    """tests_support's "deepseek_v3" family as it is (multi-head latent attention, two dense layers, seed 0), built
    once for the MLA tests (models/test_mla.py, analyses/test_kv_mla.py)."""
    return build_tiny_model("deepseek_v3", tmp_path_factory.mktemp("dsv3") / "dsv3")


@pytest.fixture(scope="session")
def more_arch_models(more_arch_dirs):
    """arch -> HookedModel of more_arch_dirs(arch), loaded on first use and shared (tests must not modify them)."""
    import functools

    import headscope as hs

    return functools.cache(lambda arch: hs.load_model(more_arch_dirs(arch), device="cpu"))


@pytest.fixture(scope="session")
def arch_models(arch_dirs):
    """arch -> HookedModel, each loaded on first use and shared (tests must not modify them); load
    warnings surface in the test that loads first, so tests that check them load their own."""
    import functools

    import headscope as hs

    return functools.cache(lambda arch: hs.load_model(arch_dirs[arch], device="cpu"))


@pytest.fixture(scope="session")
def mixed_tasks(arch_models):
    """arch -> a left-padded (decoders) or right-padded (BERT) Task of 6 user-style prompts of mixed
    token lengths (tests_support.mixed_length_rows, loaded with hs.load_task and the user's own column
    names). Compare with `task.example(i)`: row i alone, unpadded."""
    import functools

    import headscope as hs
    from tests_support import MIXED_FIELDS, mixed_length_rows

    def build(arch):
        model = arch_models(arch)
        encoder = model.facts.is_encoder
        fields = {k: v for k, v in MIXED_FIELDS.items() if not (encoder and k == "corrupted_prompt")}
        return hs.load_task(model, mixed_length_rows(model, 6, corrupt=not encoder), fields)

    return functools.cache(build)


@pytest.fixture(scope="session")
def hf_of(arch_dirs):
    """arch -> plain Hugging Face (eager attention) on the matrix's files (tests_support.hf_reference), cached."""
    import functools

    from tests_support import hf_reference

    return functools.cache(lambda arch: hf_reference(arch_dirs[arch]))


@pytest.fixture(scope="session")
def biased_dirs(tmp_path_factory):
    """Tiny GPT-2, Llama and NeoX directories whose 1-D parameters (norm weights and biases, linear
    biases) are random, d_model 48 (W_U not square): the shared tiny models have unit norm weights
    and zero biases, so numbers that must use a norm's weight or a bias are tested on these."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("biased")
    out = {}
    for family in ("gpt2", "llama", "neox"):
        width = {"gpt2": {"n_embd": 48}}.get(family, {"hidden_size": 48})  # W_U not square
        path = build_tiny_model(family, root / family, seed=3, **width)
        model = AutoModelForCausalLM.from_pretrained(path)
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 1:
                    base = 1.0 if ("norm" in name or "ln" in name) and name.endswith("weight") else 0.0
                    p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
        model.save_pretrained(path, safe_serialization=True)
        out[family] = Path(path)
    return out


@pytest.fixture(scope="session")
def biased_models(biased_dirs):
    """HookedModels of `biased_dirs`, each loaded on first use (shared; tests must not modify them)."""
    import headscope as hs

    class Loaded(dict):
        def __missing__(self, family):
            self[family] = model = hs.load_model(biased_dirs[family], device="cpu")
            return model

    return Loaded()
