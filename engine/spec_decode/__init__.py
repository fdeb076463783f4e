"""Speculative decoding (upstream's vllm/v1/spec_decode): drafts proposed
for a request's next tokens, verified by the target model in one forward,
accepted by rejection sampling so that the output distribution is the
model's own."""
