#!/usr/bin/env bash
# One variant's pipeline, in order: build and repair, smoke-test, publish.
# Any failure stops it before anything is published.
#   ci/pipeline.sh <variant> [--index INDEX]
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
variant=${1:?usage: ci/pipeline.sh <variant> [--index INDEX]}
shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash "$REPO/ci/build-wheel.sh" "$variant" "$out"
for wheel in "$out"/*.whl; do
  bash "$REPO/ci/smoke-test.sh" "$wheel"
done
bash "$REPO/ci/publish.sh" "$out" "$@"
