"""Shared transformer models that take any registered attention (filled by the models issue)."""
