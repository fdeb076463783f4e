#!/usr/bin/env bash
# Publish the wheels in a folder under the current commit:
#   ci/publish.sh <wheel dir> [--index DIR|s3://bucket/prefix] [--force]
# Wheels already published with the same bytes are left as they are (builds are
# reproducible, so publishing a commit again is a no-op); --force replaces ones
# whose bytes differ.
# nightly moves only for a commit on main; a version tag also writes the
# release pages. The branch and tag come from CI (GITHUB_REF) or from git.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
dir=${1:?usage: ci/publish.sh <wheel dir> [--index INDEX]}
shift
index=$(default_index)
force=()
while [ $# -gt 0 ]; do
  case "$1" in
    --index) index=$2; shift 2 ;;
    --force) force=(--force); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
commit=$(git -C "$REPO" rev-parse HEAD)
ref=${GITHUB_REF:-refs/heads/$(git -C "$REPO" rev-parse --abbrev-ref HEAD)}
flags=()
[ "$ref" = refs/heads/main ] && flags+=(--nightly)
if [[ "$ref" == refs/tags/v* ]] || git -C "$REPO" describe --exact-match --tags HEAD >/dev/null 2>&1; then
  flags+=(--release)
fi
shopt -s nullglob
wheels=("$dir"/*.whl)
[ ${#wheels[@]} -gt 0 ] || { echo "error: no wheels in $dir" >&2; exit 1; }
cd "$REPO"
"$PYTHON" -m wheel_index publish --index "$index" --commit "$commit" ${flags[@]+"${flags[@]}"} \
  ${force[@]+"${force[@]}"} "${wheels[@]}"
