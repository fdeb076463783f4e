#!/usr/bin/env bash
# Build one image target:
#   ci/docker-build.sh <target> [--base IMAGE] [--tag TAG] [--index DIR] [--variant V] [-- docker build args...]
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
# --index DIR: a folder wheel index, the `index` stage precompiled builds of
# docker/Dockerfile read (-- --build-arg VLLM_USE_PRECOMPILED=1). --variant V:
# the CUDA image's variant (default cu130; cu129 works the same way).
# Prints the image's tag and size last.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/lib.sh"
source "$REPO/ci/docker-lib.sh"

usage="usage: ci/docker-build.sh <vllm-engine-openai|vllm-engine-openai-zen|vllm-engine-openai-cuda> [--base IMAGE] [--tag TAG] [--index DIR] [--variant V] [-- docker build args...]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
target=$1; shift
case "$target" in
  vllm-engine-openai|vllm-engine-openai-zen) dockerfile=docker/Dockerfile.cpu; variant=cpu ;;
  vllm-engine-openai-cuda) dockerfile=docker/Dockerfile; variant=cu130 ;;
  *) echo "error: unknown target '$target'; $usage" >&2; exit 2 ;;
esac
base=$BASE_IMAGE
tag=""
index=""
variant_arg=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) [ $# -ge 2 ] || { echo "error: --base needs an image name" >&2; exit 2; }; base=$2; shift 2 ;;
    --tag) [ $# -ge 2 ] || { echo "error: --tag needs a name" >&2; exit 2; }; tag=$2; shift 2 ;;
    --index) [ $# -ge 2 ] && [ -d "$2" ] || { echo "error: --index needs a folder wheel index" >&2; exit 2; }
             index=$(cd "$2" && pwd); shift 2 ;;
    --variant) [ $# -ge 2 ] && [ "$dockerfile" = docker/Dockerfile ] ||
                 { echo "error: --variant takes a variant and only applies to vllm-engine-openai-cuda" >&2; exit 2; }
               variant=$2; variant_arg=(--build-arg "VARIANT=$2"); shift 2 ;;
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
      --label "org.opencontainers.image.title=vllm-engine" ${variant_arg[@]+"${variant_arg[@]}"})
# The host's bundle (the one pip is told to use) carries whatever CA this network needs.
ca=${VLLM_DOCKER_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
[ -n "$ca" ] && [ -s "$ca" ] && args+=(--secret "id=ca_certs,src=$ca")

# Folders the Dockerfiles take as stages (`wheels`, `index`): named contexts
# with buildx, else a scratch image of the folder passed by its build arg.
if "$DOCKER" buildx version >/dev/null 2>&1; then
  build=("$DOCKER" buildx build --load)
else
  build=("$DOCKER" build)
  export DOCKER_BUILDKIT=1
fi
folder_stage() {  # <stage> <folder> <build arg>
  if [ "${build[1]}" = buildx ]; then
    args+=(--build-context "$1=$2")
  else
    local image=vllm-engine/$1:local
    echo "==> $1 image $image from $2"
    printf 'FROM scratch\nLABEL org.opencontainers.image.title=vllm-engine\nCOPY . /\n' | "$DOCKER" build -q -t "$image" -f - "$2" >/dev/null
    args+=(--build-arg "$3=$image")
  fi
}
torch_source "$variant"
if [ "${TORCH_SOURCE[0]:-}" = --find-links ]; then folder_stage wheels "${TORCH_SOURCE[1]}" WHEELS_IMAGE; fi
if [ -n "$index" ]; then folder_stage index "$index" INDEX_IMAGE; fi

echo "==> building $tag ($dockerfile, target $target, base $base)"
"${build[@]}" "${args[@]}" ${extra[@]+"${extra[@]}"} "$REPO"
# Images this script built before under the same tag are now untagged: drop them.
"$DOCKER" image prune -f --filter label=org.opencontainers.image.title=vllm-engine >/dev/null
size=$("$DOCKER" image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1000000)) MB"
