# Shared by ci/setup-docker.sh and ci/docker-build.sh (sourced, not run).

# The local stand-in for the public debian:bookworm-slim (made by setup-docker.sh).
BASE_IMAGE=${VLLM_DOCKER_BASE_IMAGE:-vllm-engine/debian:bookworm-slim}

# A docker client that can build with BuildKit: $DOCKER if set; else `docker`
# when it has buildx or is older than 23 (classic BuildKit built in); else
# Debian's /usr/bin/docker (a newer client without buildx cannot use BuildKit).
pick_docker() {
  local c v
  if [ -n "${DOCKER:-}" ]; then return; fi
  for c in docker /usr/bin/docker; do
    command -v "$c" >/dev/null || continue
    if "$c" buildx version >/dev/null 2>&1; then DOCKER=$c; return; fi
    v=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)
    if [ -n "$v" ] && [ "${v%%.*}" -lt 23 ] 2>/dev/null; then DOCKER=$c; return; fi
  done
  DOCKER=docker
}
pick_docker
