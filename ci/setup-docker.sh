#!/usr/bin/env bash
# Make a Docker engine usable here: install dockerd (Debian's docker.io, with
# BuildKit) and debootstrap, start dockerd as root when no daemon answers, and
# build the local base image once. Public registries are unreachable from
# these machines, so the base is a debootstrapped Debian, imported, cached:
# the root-fs tarball under /var/cache/vllm-engine/docker survives a wiped
# image store, the image itself is only rebuilt when absent.
#
# Safe to run again; a no-op (a few seconds) when everything is in place.
# usage: ci/setup-docker.sh      (base image name: $VLLM_DOCKER_BASE_IMAGE)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$REPO/ci/docker-lib.sh"
source "$REPO/ci/debian-lib.sh"

cache=${VLLM_DOCKER_CACHE:-/var/cache/vllm-engine/docker}
log=${VLLM_DOCKERD_LOG:-/var/log/vllm-engine-dockerd.log}

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "error: dockerd/debootstrap missing; run ci/setup-docker.sh as root to install them" >&2; exit 2; }
  echo "==> installing docker.io and debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q -o DPkg::Lock::Timeout=600 docker.io debootstrap
fi

if ! "$DOCKER" info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "error: no Docker daemon answers and starting one needs root" >&2; exit 2; }
  echo "==> starting dockerd (log: $log)"
  # setsid: the daemon outlives this script and the CI step that ran it.
  setsid nohup dockerd >>"$log" 2>&1 </dev/null &
  for _ in $(seq 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  "$DOCKER" info >/dev/null 2>&1 || { echo "error: dockerd did not start; see $log" >&2; tail -5 "$log" >&2; exit 1; }
fi

if ! "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  tarball=$cache/bookworm-slim.tar
  if [ ! -s "$tarball" ]; then
    echo "==> debootstrap bookworm (minbase, slimmed like debian:bookworm-slim) for $BASE_IMAGE"
    mkdir -p "$cache"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    # The mirror and sources this host's apt is set up with (the ones that reach
    # Debian's packages from here); debootstrap's default where there are none.
    mirror=$(host_debian_mirror)
    debootstrap --variant=minbase bookworm "$rootfs" ${mirror:+"$mirror"} >"$cache/debootstrap.log" 2>&1 ||
      { echo "error: debootstrap failed; see $cache/debootstrap.log" >&2; tail -5 "$cache/debootstrap.log" >&2; exit 1; }
    copy_host_apt_sources "$rootfs"
    # What makes the public image "slim": no docs, man pages or translations,
    # and apt keeps no package caches in image layers.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
APT::Install-Recommends "false";
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
  fi
  echo "==> importing $BASE_IMAGE"
  "$DOCKER" import --change 'CMD ["bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
fi
# Bound BuildKit's cache (compiler and uv caches, old layers) on long-lived machines.
"$DOCKER" builder prune -f --keep-storage 20gb >/dev/null 2>&1 || true
echo "docker ready: server $("$DOCKER" version --format '{{.Server.Version}}'), base image $BASE_IMAGE"
