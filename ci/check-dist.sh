#!/usr/bin/env bash
# Release checks of built distributions, as a package index and its users see
# them: ci/check-dist.sh <wheel or sdist>...
#   twine check --strict    metadata and long description render
#   check-wheel-contents    wheel layout (wheels)
#   abi3audit --strict      the extension uses only the stable ABI it is tagged for (wheels)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: ci/check-dist.sh <wheel or sdist>..." >&2; exit 2; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
bin=$(dirname "$PYTHON")
for tool in twine check-wheel-contents abi3audit; do
  [ -x "$bin/$tool" ] || { echo "error: $tool is not installed beside $PYTHON (pip install -r requirements/ci.txt)" >&2; exit 2; }
done
for f in "$@"; do
  [ -f "$f" ] || { echo "error: $f does not exist" >&2; exit 2; }
  if [[ "$f" == *.whl ]] && ! "$PYTHON" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).testzip()" "$f" 2>/dev/null; then
    echo "error: $f is not a readable wheel (zip archive); rebuild it" >&2; exit 1
  fi
done
"$bin/twine" check --strict "$@"
wheels=()
for f in "$@"; do [[ "$f" == *.whl ]] && wheels+=("$f"); done
if [ ${#wheels[@]} -gt 0 ]; then
  "$bin/check-wheel-contents" "${wheels[@]}"
  "$bin/abi3audit" --strict --report "${wheels[@]}" >/dev/null
  echo "abi3audit: ${#wheels[@]} wheel(s) use only the stable ABI"
fi
