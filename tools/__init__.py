"""Build-time tooling of vllm-engine: variant table, target detection, the PEP 517
backend, version and requirement metadata. Nothing here imports torch."""
