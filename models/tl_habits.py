"""TransformerLens habits on HookedModel: the calls a TransformerLens 4.3 user types without thinking.

`model("text")`, `model(tokens, return_type="loss")`, `model.run_with_cache(...)`, `model.generate(...)`,
`to_string`, `to_single_token`, `cfg`, `W_U` / `W_E` / `W_pos` / `b_U`, `add_hook` / `reset_hooks`,
`model.hooks(fwd_hooks=...)` and `run_with_hooks(fwd_hooks=...)`, each behaving as TransformerLens's
TransformerBridge does on the same checkpoint (tests/models/test_tl_habits.py checks each against it),
plus headscope's one-line errors: a hook name that does not exist gets the closest names, a string of
several tokens given to to_single_token names its pieces. Hook functions see the name they were
registered under (`hook.name == "blocks.0.hook_resid_post"`, where the bridge alone reports its
canonical `blocks.0.hook_out`).

HookedModel inherits TLHabits (models/hooked_model.py); analyses above the models layer provide what
models cannot import themselves (`provide("run_with_cache", fn)`: hooks/capture.py does, on import).
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from headscope.errors import (
    ConfigError,
    ContextLengthError,
    InputTypeError,
    SiteError,
    UnsupportedAttributeError,
    UnsupportedModelError,
    VocabularyError,
    did_you_mean,
)

HookFn = Callable[..., Any]
HookList = Sequence[tuple[Any, HookFn]]  # (name or names filter, fn)
RETURN_TYPES = ("logits", "loss", "both", None)

# What layers above models provide (models cannot import them): name -> function.
_PROVIDED: dict[str, Callable[..., Any]] = {}


def provide(name: str, fn: Callable[..., Any]) -> None:
    """Install a function a TransformerLens habit delegates to ("run_with_cache": hooks.capture's)."""
    _PROVIDED[name] = fn


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                    per_token: bool = False) -> torch.Tensor:
    """Mean next-token cross-entropy (TransformerLens's lm_cross_entropy_loss, Hugging Face's `labels=` loss):
    logits [batch, pos, d_vocab] predict tokens [batch, pos] one position on. per_token: [batch, pos - 1]
    (0 where the mask drops a position). With an attention mask [batch, pos], a position counts only
    when it and the next token are real."""
    log_probs = logits[:, :-1].float().log_softmax(-1)  # [batch, pos - 1, d_vocab]
    losses = -log_probs.gather(-1, tokens[:, 1:, None].to(logits.device))[..., 0]  # [batch, pos - 1]
    if attention_mask is None:
        return losses if per_token else losses.mean()
    mask = attention_mask.to(logits.device).bool()
    keep = mask[:, :-1] & mask[:, 1:]  # [batch, pos - 1]
    losses = losses.masked_fill(~keep, 0.0)
    return losses if per_token else losses.sum() / keep.sum()


class NamedHookPoint:
    """The hook point a hook function receives, reporting the name the hook was registered under.

    TransformerLens 4.3 resolves aliases (blocks.0.hook_resid_post is the block's hook_out) and hands
    hook functions the canonical point, so `hook.name` would read "blocks.0.hook_out"; everything else
    (ctx, layer(), the module) is the real point's."""

    __slots__ = ("_point", "name")

    def __init__(self, name: str, point: Any) -> None:
        self.name = name
        self._point = point

    def __getattr__(self, attr: str) -> Any:
        if attr == "_point":  # not set yet (copy, pickle): no recursion
            raise AttributeError(attr)
        return getattr(self._point, attr)

    def layer(self) -> int:
        return int(self.name.split(".")[1])

    def __repr__(self) -> str:
        return f"NamedHookPoint({self.name!r} -> {getattr(self._point, 'name', None)!r})"


class ConfigView:
    """Read-only view of the bridge's TransformerLens config (`model.cfg.n_layers`, `d_head`, `act_fn`,
    `normalization_type`, `n_key_value_heads`, ...): every field reads as TransformerLens's bridge cfg
    has it, where loading has set those the bridge leaves at their defaults from the HF config (d_mlp; review 18b
    A3: attn_scale, use_qk_norm, window_size, attn_types, rotary_base(_local), scale_embedding:
    models/config_facts.tl_config_fields). Setting a field is refused: headscope reads the architecture once, at load."""

    __slots__ = ("_cfg",)
    SHOWN = ("n_layers", "n_heads", "n_key_value_heads", "d_model", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn",
             "normalization_type", "positional_embedding_type")

    def __init__(self, cfg: Any) -> None:
        object.__setattr__(self, "_cfg", cfg)

    def __getattr__(self, name: str) -> Any:
        if name == "_cfg":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._cfg, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise ConfigError(f"model.cfg is read-only ({name} = {value!r}); headscope reads the architecture once, at load: "
                          f"change the checkpoint's config.json, or load with hs.load_model(..., dtype=...) for a dtype.")

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._cfg)))

    def __reduce__(self) -> tuple:  # copy and pickle rebuild the view over (a copy of) the config
        return (ConfigView, (self._cfg,))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={getattr(self._cfg, k, None)!r}" for k in self.SHOWN)
        return f"ConfigView({shown}, ...)"


def _one_of(what: str, short: HookList | None, long: HookList | None) -> list:
    """fwd= / fwd_hooks= (bwd= / bwd_hooks=): the same argument under headscope's and TransformerLens's names."""
    if short is not None and long is not None:
        raise ConfigError(f"got both {what}= and {what}_hooks=; they are the same argument, pass one.")
    return list(short if short is not None else long or ())


def _pair(item: Any) -> tuple[Any, HookFn]:
    """One (name, fn) entry of a hook list, or one line on what a hook list holds."""
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InputTypeError(f"a hook list holds (name, function) pairs, e.g. fwd_hooks=[('blocks.0.hook_resid_post', fn)]; "
                             f"got {type(item).__name__} {item!r:.80}.")
    return item[0], item[1]


class TLHabits:
    """TransformerLens's HookedTransformer / TransformerBridge surface on HookedModel (module docstring).

    Relies on HookedModel's bridge, tokenizer, facts, to_tokens, check_tokens, device and `_logits`
    (the plain forward: hook-free where nothing is attached, else the bridge)."""

    bridge: Any
    tokenizer: Any
    facts: Any

    # ---- input --------------------------------------------------------------------------
    def input_tokens(self, input: Any, *, prepend_bos: bool | None = None) -> torch.Tensor:
        """Token ids [batch, pos] of a string (tokenized as to_tokens does: BOS prepended on decoders)
        or a token tensor (checked). A list of strings of different token lengths needs to_tokens(...,
        padding=True) and the mask: one line says so."""
        if isinstance(input, str) or (isinstance(input, (list, tuple)) and input and all(isinstance(t, str) for t in input)):
            return self.to_tokens(input, prepend_bos=prepend_bos)
        return self.check_tokens(input)

    # ---- running ------------------------------------------------------------------------
    def forward(self, input: Any, *, attention_mask: torch.Tensor | None = None, return_type: str | None = "logits",
                loss_per_token: bool = False, prepend_bos: bool | None = None) -> Any:
        """`model(tokens)` / `model("text")`: logits [batch, pos, d_vocab] for decoders (hidden states
        [batch, pos, d_model] for encoders), as `_logits`. return_type (TransformerLens's): "logits";
        "loss", the mean next-token cross-entropy (loss_per_token=True: [batch, pos - 1]); "both",
        (logits, loss); None, nothing (the pass runs for its hooks). A string is tokenized as to_tokens
        does (BOS prepended on decoders)."""
        if return_type not in RETURN_TYPES:
            raise ConfigError(f"return_type {return_type!r} is not one of {list(RETURN_TYPES)}.")
        tokens = self.input_tokens(input, prepend_bos=prepend_bos)
        if return_type in ("loss", "both") and self.facts.is_encoder:
            raise UnsupportedModelError(f"return_type={return_type!r} is a next-token loss; {self.facts.name} is an encoder "
                                        f"without one (its forward gives hidden states).")
        logits = self._logits(tokens, attention_mask=attention_mask)
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = next_token_loss(logits, tokens, attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def run_with_hooks(self, input: Any, fwd_hooks: HookList | None = None, bwd_hooks: HookList | None = None, *,
                       fwd: HookList | None = None, bwd: HookList | None = None, **kwargs: Any) -> Any:
        """One forward pass with temporary hooks, removed afterwards (exceptions included); kwargs go
        to `forward` (attention_mask, return_type, ...). fwd= / bwd= are headscope's spellings of
        TransformerLens's fwd_hooks= / bwd_hooks=; give one of each pair."""
        with self.hooks(_one_of("fwd", fwd, fwd_hooks), _one_of("bwd", bwd, bwd_hooks)):
            return self.forward(input, **kwargs)

    @contextmanager
    def hooks(self, fwd_hooks: HookList | None = None, bwd_hooks: HookList | None = None, *,
              fwd: HookList | None = None, bwd: HookList | None = None) -> Iterator[Any]:
        """Attach hooks for the duration of the block (TransformerLens's fwd_hooks= / bwd_hooks=, or
        fwd= / bwd=); removed on exit, exceptions included. A name the model does not have is a
        SiteError naming the closest ones; a names filter (a callable) goes to the bridge as is."""
        fwd_list = [self._checked_hook(*_pair(item)) for item in _one_of("fwd", fwd, fwd_hooks)]
        bwd_list = [self._checked_hook(*_pair(item)) for item in _one_of("bwd", bwd, bwd_hooks)]
        with self.bridge.hooks(fwd_hooks=fwd_list, bwd_hooks=bwd_list):
            yield self

    def add_hook(self, name: str | Callable[[str], bool], hook_fn: HookFn, dir: str = "fwd",
                 is_permanent: bool = False) -> None:
        """Attach a hook until `reset_hooks()` (TransformerLens's add_hook): name, or a names filter
        (a callable over hook names); dir "fwd" or "bwd"; is_permanent=True survives reset_hooks()
        unless it is called with including_permanent=True."""
        if dir not in ("fwd", "bwd"):
            raise ConfigError(f"add_hook dir must be 'fwd' or 'bwd', got {dir!r}.")
        name, hook_fn = self._checked_hook(name, hook_fn)
        self.bridge.add_hook(name, hook_fn, dir=dir, is_permanent=is_permanent)

    def reset_hooks(self, including_permanent: bool = False, *, clear_contexts: bool = True,
                    direction: str = "both") -> None:
        """Remove the hooks add_hook attached (TransformerLens's reset_hooks): temporary ones, and
        permanent ones too with including_permanent=True; direction "fwd", "bwd" or "both"."""
        if direction not in ("fwd", "bwd", "both"):
            raise ConfigError(f"reset_hooks direction must be 'fwd', 'bwd' or 'both', got {direction!r}.")
        self.bridge.reset_hooks(clear_contexts=clear_contexts, direction=direction,
                                including_permanent=including_permanent)

    def hook_point_table(self) -> dict[str, Any]:
        """The bridge's hook points by name (its hook_dict, aliases included), built once per model."""
        table = getattr(self, "_headscope_hook_points", None)
        if table is None:
            table = self._headscope_hook_points = dict(self.bridge.hook_dict)
        return table

    def _checked_hook(self, name: Any, fn: HookFn) -> tuple[Any, HookFn]:
        """(name, fn) ready for the bridge: a name the model lacks is refused with the closest names;
        a TransformerLens alias gets fn wrapped so that `hook.name` is the name given."""
        if not isinstance(name, str):
            if callable(name):
                return name, fn
            raise InputTypeError(f"a hook is (name, function) with name a hook name or a filter over names; got "
                                 f"{type(name).__name__} {name!r}.")
        if not callable(fn):
            raise InputTypeError(f"the hook on {name!r} must be a function (activation, hook) -> activation or None; "
                                 f"got {type(fn).__name__}.")
        table = self.hook_point_table()
        point = table.get(name)
        if point is None:
            hint = (" A negative layer counts from the end only through hs.site(kind, layer, model=model)."
                    if name.startswith("blocks.-") else "")
            raise SiteError(f"{self.facts.name} has no hook {name!r}. Did you mean {did_you_mean(name, table)}?{hint}")
        if getattr(point, "name", name) == name:
            return name, fn
        named = NamedHookPoint(name, point)

        def reports_its_name(act: Any, hook: Any) -> Any:
            return fn(act, hook=named)

        return name, reports_its_name

    def run_with_cache(self, input: Any, names_filter: Any = None, *, names: Any = None,
                       attention_mask: torch.Tensor | None = None, positions: Any = None, to_cpu: bool = False,
                       prepend_bos: bool | None = None) -> tuple[torch.Tensor, Any]:
        """(logits, Activations) of one pass, as hs.run_with_cache(model, tokens, ...): every site by
        default, or what names_filter (a name, a list, or a callable over names) selects. A string
        is tokenized as to_tokens does."""
        if "run_with_cache" not in _PROVIDED:  # hooks/capture.py provides it when headscope is imported
            raise UnsupportedModelError("model.run_with_cache needs headscope.hooks imported; `import headscope` does.")
        tokens = self.input_tokens(input, prepend_bos=prepend_bos)
        return _PROVIDED["run_with_cache"](self, tokens, names, names_filter=names_filter, attention_mask=attention_mask,
                                           positions=positions, to_cpu=to_cpu)

    # ---- generation ---------------------------------------------------------------------
    def generate(self, input: Any = "", max_new_tokens: int = 10, *, stop_at_eos: bool = True,
                 eos_token_id: int | None = None, do_sample: bool = True, top_k: int | None = None,
                 top_p: float | None = None, temperature: float = 1.0, freq_penalty: float = 0.0,
                 repetition_penalty: float = 1.0, use_past_kv_cache: bool = True, prepend_bos: bool | None = None,
                 return_type: str = "input", seed: int | None = None, attention_mask: torch.Tensor | None = None,
                 verbose: bool = False) -> Any:
        """Sample (do_sample=True, TransformerLens's default) or greedily decode max_new_tokens tokens
        after `input` (a string, a list of strings, or tokens [batch, pos]), through the bridge, so
        attached hooks fire at every step. Strings are tokenized as to_tokens does (a list of
        different token lengths is left-padded, with its mask; left-padded tokens need their
        attention_mask [batch, pos], 1 on real tokens). return_type: "input" (a string for
        string input, tokens for tokens), "str" (prompt and continuation, decoded without special
        tokens) or "tokens" ([batch, pos + new]); one row decodes to a string, several to a list.
        seed: sample reproducibly without touching the global torch generator. Arguments as
        TransformerLens's TransformerBridge.generate (verbose, accepted for its callers, shows nothing)."""
        if self.facts.is_encoder:
            raise UnsupportedModelError(f"{self.facts.name} is an encoder; generate needs a decoder.")
        if return_type not in ("input", "str", "tokens"):
            raise ConfigError(f"generate return_type must be 'input', 'str' or 'tokens', got {return_type!r}.")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
        if do_sample and not temperature > 0:
            raise ConfigError(f"temperature must be > 0 when sampling, got {temperature!r}; do_sample=False decodes "
                              f"greedily.")
        mask = None
        if isinstance(input, str):
            tokens, kind = self.to_tokens(input, prepend_bos=prepend_bos), "str"
        elif isinstance(input, (list, tuple)) and input and all(isinstance(t, str) for t in input):
            tokens, mask = self.to_tokens(list(input), prepend_bos=prepend_bos, padding=True)
            kind = "str"
            mask = None if bool(mask.all()) else mask
        else:
            tokens, kind = self.check_tokens(input), "tokens"
            if attention_mask is not None:
                if tuple(attention_mask.shape) != tuple(tokens.shape):
                    raise ConfigError(f"attention_mask has shape {list(attention_mask.shape)}, the tokens "
                                      f"{list(tokens.shape)}; pass the mask to_tokens(..., padding=True) gave with them.")
                mask = None if bool(attention_mask.all()) else attention_mask.to(tokens.device)
        total = tokens.shape[1] + max_new_tokens
        if self.facts.fixed_context and total > self.facts.n_ctx:
            raise ContextLengthError(f"prompt ({tokens.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                                     f"exceeds {self.facts.name}'s context of {self.facts.n_ctx}; generate fewer tokens or "
                                     f"shorten the prompt.")
        rng = contextlib.nullcontext()
        if seed is not None:
            devices = [tokens.device] if tokens.device.type == "cuda" else []
            rng = torch.random.fork_rng(devices=devices)
        with rng, torch.no_grad(), warnings.catch_warnings():
            # transformers deprecates the past_key_values= the bridge passes on each cached step (noise, not news)
            warnings.filterwarnings("ignore", message=r".*past_key_values.*deprecated", category=FutureWarning)
            if seed is not None:
                torch.manual_seed(seed)
            out = self.bridge.generate(
                tokens, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos, eos_token_id=eos_token_id,
                do_sample=do_sample, top_k=top_k, top_p=top_p, temperature=temperature, freq_penalty=freq_penalty,
                repetition_penalty=repetition_penalty, use_past_kv_cache=use_past_kv_cache, return_type="tokens",
                verbose=False, attention_mask=mask,
            )  # [batch, pos + new]
        if return_type == "tokens" or (return_type == "input" and kind == "tokens"):
            return out
        texts = [self.tokenizer.decode(row, skip_special_tokens=True) for row in out.tolist()]
        return texts[0] if len(texts) == 1 else texts

    # ---- tokens -------------------------------------------------------------------------
    def to_string(self, tokens: Any) -> str | list[str]:
        """Decode token ids to text as TransformerLens does: [pos] (or a list of ids) -> a string,
        [batch, pos] -> a list of strings (special tokens kept, no clean-up of spaces)."""
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return self.tokenizer.batch_decode(tokens.tolist(), clean_up_tokenization_spaces=False)
        if tokens.ndim <= 1:
            return self.tokenizer.decode(tokens.reshape(-1).tolist(), clean_up_tokenization_spaces=False)
        raise InputTypeError(f"to_string takes token ids [pos] or [batch, pos]; got shape {list(tokens.shape)}.")

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token (no BOS added); a VocabularyError naming the
        pieces when the tokenizer splits it."""
        if not isinstance(string, str):
            raise InputTypeError(f"to_single_token takes a string, got {type(string).__name__}.")
        ids = list(self.tokenizer(string, add_special_tokens=False)["input_ids"])
        if len(ids) != 1:
            pieces = ", ".join(repr(self.tokenizer.decode([i])) for i in ids) or "nothing"
            raise VocabularyError(f"{string!r} is {len(ids)} tokens for {self.facts.name} ({pieces}), not one; use one of "
                                  f"them, or model.to_tokens(text, prepend_bos=False) for several.")
        return int(ids[0])

    # ---- config and weights -------------------------------------------------------------
    @property
    def cfg(self) -> ConfigView:
        """TransformerLens's config of the bridge, read-only (ConfigView): model.cfg.n_layers, d_head, ..."""
        return ConfigView(self.bridge.cfg)

    @property
    def W_U(self) -> torch.Tensor:
        """Unembedding [d_model, d_vocab], as the (unprocessed) bridge's: no final-norm weight folded in."""
        return self.bridge.W_U

    @property
    def b_U(self) -> torch.Tensor:
        """Unembedding bias [d_vocab] (zeros where the model has none), as the bridge's."""
        return self.bridge.b_U

    @property
    def W_E(self) -> torch.Tensor:
        """Token embedding [d_vocab, d_model], as the bridge's."""
        return self.bridge.W_E

    @property
    def W_pos(self) -> torch.Tensor:
        """Learned position embedding [n_ctx, d_model] (GPT-2, BERT); rotary models have none, which
        is an UnsupportedAttributeError (an AttributeError, so hasattr(model, "W_pos") is False)."""
        try:
            return self.bridge.W_pos
        except AttributeError:
            raise UnsupportedAttributeError(
                f"{self.facts.name} has no W_pos: its positions are {self.facts.positional}, not a learned embedding "
                f"matrix."
            ) from None
