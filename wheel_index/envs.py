"""The environment variables the wheel index reads, each read here only
(docs/environment-variables.md says what they do)."""
from __future__ import annotations

import os


def debug() -> bool:
    """VLLM_DEBUG: a failure raises with its traceback instead of one line."""
    return bool(os.environ.get("VLLM_DEBUG"))


def log_requests() -> bool:
    """VLLM_INDEX_LOG: the server logs each request (quiet by default)."""
    return bool(os.environ.get("VLLM_INDEX_LOG"))
