#!/usr/bin/env bash
# Builds and installs HALO for C and C++ programs:
#   PREFIX/lib/libhalo.so, PREFIX/lib/libhalo.a    the library (ffi)
#   PREFIX/include/halo.h                          the header
#   PREFIX/lib/pkgconfig/halo.pc                   for pkg-config (links libhalo.so)
#   PREFIX/lib/pkgconfig/halo-static.pc            ... (links libhalo.a)
#   PREFIX/bin/halo                                `halo launch -n N -- ./prog` and friends
#
#   bash scripts/install-c.sh                 # release build, PREFIX=/usr/local
#   bash scripts/install-c.sh ~/.local        # another prefix
#   bash scripts/install-c.sh --from DIR PREFIX
#        # install what is already built in DIR (libhalo.so, libhalo.a, and halo if
#        # there) instead of building: what the tests use with target/debug/deps
#
# Then: gcc prog.c $(pkg-config --cflags --libs halo)
# (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig and LD_LIBRARY_PATH=PREFIX/lib when
# PREFIX is not a system prefix; see README, "Using HALO from C").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

from=""
if [ "${1:-}" = "--from" ]; then
  from="${2:?--from needs a directory}"
  shift 2
fi
prefix="${1:-/usr/local}"
case "$prefix" in
  /*) ;;
  *) prefix="$(pwd)/$prefix" ;;
esac

if [ -z "$from" ]; then
  bash "$root/scripts/deps.sh"
  cd "$root"
  # libhalo.so / libhalo.a, and the `halo` launcher (package halo-cli).
  cargo build --release -p halo-ffi -p halo-cli
  from="${CARGO_TARGET_DIR:-$root/target}/release"
fi

for f in libhalo.so libhalo.a; do
  [ -f "$from/$f" ] || { echo "install-c.sh: $from/$f not found" >&2; exit 1; }
done

header="$root/ffi/include/halo.h"
version="$(awk '/#define HALO_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$header")"

install -d "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin"
install -m 755 "$from/libhalo.so" "$prefix/lib/libhalo.so"
install -m 644 "$from/libhalo.a" "$prefix/lib/libhalo.a"
install -m 644 "$header" "$prefix/include/halo.h"
for pc in halo halo-static; do
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" \
    "$root/ffi/$pc.pc.in" > "$prefix/lib/pkgconfig/$pc.pc"
  chmod 644 "$prefix/lib/pkgconfig/$pc.pc"
done
if [ -x "$from/halo" ]; then
  install -m 755 "$from/halo" "$prefix/bin/halo"
fi

# Let the dynamic loader find libhalo.so in the system prefixes.
if [ "$(id -u)" -eq 0 ] && command -v ldconfig >/dev/null &&
   { [ "$prefix" = /usr/local ] || [ "$prefix" = /usr ]; }; then
  ldconfig
fi

echo "installed HALO $version under $prefix"
case "$prefix" in
  /usr | /usr/local) ;;
  *)
    echo "  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
    echo "  export LD_LIBRARY_PATH=$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    if [ -x "$prefix/bin/halo" ]; then
      echo "  export PATH=$prefix/bin:\$PATH"
    fi
    ;;
esac
