"""Imports the built-in engines so that they register (transformers first: it is the reference row)."""

from posenc.engines import hf_transformers, llama_cpp, vllm, sglang, mlx  # noqa: F401
