"""Ways in: the OpenAI-compatible server and its command-line clients."""
