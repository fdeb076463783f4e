#!/usr/bin/env bash
# Two builds of one commit must be byte-identical wheels: build it in two fresh
# clones, at two paths and two times, each compiling for real (the compiler
# caches recompile instead of answering), and compare them with
# `python -m tools.reproducible --compare`, which prints diffoscope's report
# (the Debian package `diffoscope` or `diffoscope-minimal`) where they differ.
# Checks the commit, not uncommitted changes.
#   ci/reproducible-check.sh [VARIANT] [--commit REV] [--keep DIR]   (default: cpu, HEAD)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
variant=cpu
rev=HEAD
keep=
while [ $# -gt 0 ]; do
  case $1 in
    --commit) rev=${2:?--commit needs a revision}; shift 2 ;;
    --keep) keep=${2:?--keep needs a folder}; shift 2 ;;
    -*) echo "error: unknown argument $1; usage: ci/reproducible-check.sh [VARIANT] [--commit REV] [--keep DIR]" >&2; exit 2 ;;
    *) variant=$1; shift ;;
  esac
done
commit=$(git -C "$REPO" rev-parse --verify "$rev^{commit}") ||
  { echo "error: no commit $rev in $REPO" >&2; exit 2; }
command -v diffoscope >/dev/null ||
  echo "note: diffoscope is not installed (apt-get install diffoscope-minimal); a difference is reported member by member"
work=$(mktemp -d "${TMPDIR:-/tmp}/reproducible.XXXXXX")
trap 'rm -rf "$work"' EXIT
for side in a b; do
  # Another path per side (so a path that leaks shows), and time between the two.
  clone=$work/clone-$side-$RANDOM
  git clone -q --no-local --no-checkout "$REPO" "$clone"
  git -C "$clone" checkout -q --detach "$commit"
  echo "==> build $side: $variant of ${commit:0:12} in $clone"
  CCACHE_RECACHE=1 SCCACHE_RECACHE=1 PYTHON=$PYTHON UV=$UV \
    bash "$clone/ci/build-wheel.sh" "$variant" "$work/$side"
  [ "$side" = b ] || sleep 2
done
wheels=("$work"/a/*.whl "$work"/b/*.whl)
if [ -n "$keep" ]; then
  mkdir -p "$keep/a" "$keep/b"
  cp "$work"/a/*.whl "$keep/a/" && cp "$work"/b/*.whl "$keep/b/"
fi
(cd "$REPO" && "$PYTHON" -m tools.reproducible --compare "${wheels[@]}")
