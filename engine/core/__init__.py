"""The engine core: requests and sequences, the scheduler, the KV cache manager
and the step loop."""
