# Debian root file systems made here (the Docker base image, the arm64 chroot)
# reach Debian's packages the way this host's apt does: the same mirror and
# sources, read from its apt configuration, never spelled in this repository.
# Sourced, not run.

# The first Debian mirror this host's apt uses (deb822 .sources or sources.list);
# empty when none is configured (debootstrap then uses its own default).
host_debian_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f" | head -1
    return
  done
  [ -f /etc/apt/sources.list ] &&
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
      /etc/apt/sources.list | head -1
}

# Give a bookworm root file system this host's apt sources (main, updates,
# security), so `apt-get update` inside it reaches what the host reaches.
copy_host_apt_sources() {
  local root=$1 f copied=0
  mkdir -p "$root/etc/apt/sources.list.d"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    grep -qi debian "$f" || continue
    cp "$f" "$root/etc/apt/sources.list.d/"
    copied=1
  done
  if [ "$copied" = 1 ]; then
    : >"$root/etc/apt/sources.list"
  elif [ -f /etc/apt/sources.list ]; then
    cp /etc/apt/sources.list "$root/etc/apt/sources.list"
  fi
}
