#!/usr/bin/env bash
# Build one image target: ci/docker-build.sh <target> [--base IMAGE] [--tag TAG] [-- docker build args...]
#
#   vllm-engine-openai, vllm-engine-openai-zen   docker/Dockerfile.cpu
#   vllm-engine-openai-cuda                      docker/Dockerfile (cu130; build args after --,
#                                                e.g. -- --build-arg VLLM_USE_PRECOMPILED=1)
#
# Passes the version and commit (the context has no .git), the host's CA bundle
# as the BuildKit secret ca_certs, and the folder of wheels that holds the cpu
# torch ($VLLM_TORCH_FIND_LINKS or pip's find-links, as ci/lib.sh finds it) as
# the `wheels` stage. The base defaults to the local image ci/setup-docker.sh
# makes ($VLLM_DOCKER_BASE_IMAGE); --base debian:bookworm-slim uses the public one.
# Prints the image's tag and size last.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
source "$REPO/ci/docker-lib.sh"

usage="usage: ci/docker-build.sh <vllm-engine-openai|vllm-engine-openai-zen|vllm-engine-openai-cuda> [--base IMAGE] [--tag TAG] [-- docker build args...]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
target=$1; shift
case "$target" in
  vllm-engine-openai|vllm-engine-openai-zen) dockerfile=docker/Dockerfile.cpu; variant=cpu ;;
  vllm-engine-openai-cuda) dockerfile=docker/Dockerfile; variant=cu130 ;;
  *) echo "error: unknown target '$target'; $usage" >&2; exit 2 ;;
esac
base=$BASE_IMAGE
tag=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] || { echo "error: --base needs an image name" >&2; exit 2; }; base=$2; shift 2 ;;
    --tag) [ $# -ge 2 ] || { echo "error: --tag needs a name" >&2; exit 2; }; tag=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "error: unknown option '$1'; $usage" >&2; exit 2 ;;
  esac
done

version=$(cd "$REPO" && "$PYTHON" -c "
from pathlib import Path
from tools.version import scm_version
print(scm_version(Path('.')))")
commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
tag=${tag:-vllm-engine/$target:$(echo "$version" | tr '+' '-')}

args=(-f "$REPO/$dockerfile" --target "$target" -t "$tag"
      --build-arg "BASE_IMAGE=$base" --build-arg "VLLM_VERSION=$version"
      --build-arg "VLLM_GIT_COMMIT=$commit"
      --label "org.opencontainers.image.version=$version"
      --label "org.opencontainers.image.revision=$commit"
      --label "org.opencontainers.image.title=vllm-engine")
# The host's bundle (the one pip is told to use) carries whatever CA this network needs.
ca=${VLLM_DOCKER_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
[ -n "$ca" ] && [ -s "$ca" ] && args+=(--secret "id=ca_certs,src=$ca")

# The folder of wheels: a named context with buildx, else a scratch image of it.
torch_source "$variant"
wheels=""
if [ "${TORCH_SOURCE[0]:-}" = --find-links ]; then wheels=${TORCH_SOURCE[1]}; fi
if "$DOCKER" buildx version >/dev/null 2>&1; then
  build=("$DOCKER" buildx build --load)
  [ -n "$wheels" ] && args+=(--build-context "wheels=$wheels")
else
  build=("$DOCKER" build)
  export DOCKER_BUILDKIT=1
  if [ -n "$wheels" ]; then
    wheels_image=vllm-engine/wheels:local
    echo "==> wheels image $wheels_image from $wheels"
    printf 'FROM scratch\nCOPY . /\n' | "$DOCKER" build -q -t "$wheels_image" -f - "$wheels" >/dev/null
    args+=(--build-arg "WHEELS_IMAGE=$wheels_image")
  fi
fi

echo "==> building $tag ($dockerfile, target $target, base $base)"
"${build[@]}" "${args[@]}" ${extra[@]+"${extra[@]}"} "$REPO"
# Images this script built before under the same tag are now untagged: drop them.
"$DOCKER" image prune -f --filter label=org.opencontainers.image.title=vllm-engine >/dev/null
size=$("$DOCKER" image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1000000)) MB"
