"""The zoo registry: names, directories and errors."""
from __future__ import annotations

import pytest

from headscope.errors import ModelNotFoundError
from headscope.models.zoo import registry


def test_unknown_name_error_lists_available_names():
    with pytest.raises(ModelNotFoundError) as info:
        registry.checkpoint_dir("zoo/no-such-model")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "no-such-model" in message
    for name in registry.available():
        assert name in message


def test_shipped_names_resolve_with_and_without_prefix():
    for name in registry.available():
        assert registry.checkpoint_dir(name) == registry.checkpoint_dir(f"zoo/{name}")
        assert (registry.checkpoint_dir(name) / "model.safetensors").is_file()


def test_describe_has_one_row_per_model():
    rows = registry.describe()
    assert [r["name"] for r in rows] == [f"zoo/{n}" for n in registry.available()]
    assert len(registry.format_rows(rows)) == len(rows)


def test_default_models_are_shipped():
    assert {"synth-llama", "synth-gpt2"} <= set(registry.available())
