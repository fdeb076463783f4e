"""The one exception type for mistakes a user can fix."""
from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message says what was wrong and how to fix it.

    Command-line entry points print it without a traceback (set VLLM_DEBUG=1 to
    see one); anything else that escapes is a bug and keeps its traceback.
    """
