"""The package version, read by pyproject.toml and `headscope --version`."""

__version__ = "0.1.0"
