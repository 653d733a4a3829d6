#!/usr/bin/env bash
# Unpacks the Debian packages kiln builds against into .deps/sysroot, for the GPU machine (whose image has
# CUDA, cmake and ninja but none of these headers/static libraries, and no network). Run here; carry .deps/sysroot.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(nlohmann-json3-dev libpcre2-dev libutf8proc-dev libgtest-dev libcpp-httplib-dev libcpp-httplib0.11
  libbrotli-dev libssl-dev zlib1g-dev  # httplib.h includes brotli, OpenSSL and zlib headers (Debian builds it with all three)
  libssl3 zlib1g  # the shared libcrypto / libz that src/vision links (libssl-dev's and zlib1g-dev's .so point at them)
  libpng-dev libjpeg62-turbo-dev libwebp-dev)  # src/vision's decoders, linked from their static archives
mkdir -p .deps/debs .deps/sysroot
(cd .deps/debs && apt-get download "${pkgs[@]}" >/dev/null)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/sysroot; done

# Boost (header-only here, ~190 MB unpacked): only what the server's transport includes, as the preprocessor
# finds it, plus all of boost/config (it picks headers by compiler, which may differ on the GPU machine).
boost_dir=.deps/boost  # apart from .deps/debs, which is unpacked whole above
if [[ ! -d "$boost_dir/usr/include/boost" ]]; then
  mkdir -p "$boost_dir"
  (cd "$boost_dir" && apt-get download libboost1.81-dev >/dev/null && dpkg -x libboost1.81-dev_*.deb .)
fi
inc="$PWD/$boost_dir/usr/include"
dest="$PWD/.deps/sysroot/usr/include"
{
  g++ -std=c++20 -M -MT x -isystem "$inc" -Iinclude -Isrc src/server/http_transport.cpp | tr ' \\' '\n\n' |
    sed -n "s|^$inc/||p"
  (cd "$inc" && find boost/config -type f)
} | sort -u >.deps/boost-headers.txt
list="$PWD/.deps/boost-headers.txt"
(cd "$inc" && xargs cp --parents -t "$dest" <"$list")
echo "device deps: $(wc -l <.deps/boost-headers.txt) Boost headers packed"
echo "device deps: $(du -sh .deps/sysroot | cut -f1) in .deps/sysroot"
