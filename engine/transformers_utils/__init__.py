"""Checkpoint formats other than a Hugging Face folder, read into one (as
upstream's vllm/transformers_utils): GGUF files."""
