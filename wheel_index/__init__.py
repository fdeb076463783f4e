"""The wheel index: every commit's wheels per variant, plus nightly and release
aliases, as PEP 503/691/658 pages that pip and uv install from."""
