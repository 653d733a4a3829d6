#!/usr/bin/env bash
# Unpacks the Debian packages kiln builds against into .deps/sysroot, for the GPU machine (whose image has
# CUDA, cmake and ninja but none of these headers/static libraries, and no network). Run here; carry .deps/sysroot.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(nlohmann-json3-dev libpcre2-dev libutf8proc-dev libgtest-dev libcpp-httplib-dev libcpp-httplib0.11
  libbrotli-dev libssl-dev zlib1g-dev)  # httplib.h includes brotli, OpenSSL and zlib headers (Debian builds it with all three)
mkdir -p .deps/debs .deps/sysroot
(cd .deps/debs && apt-get download "${pkgs[@]}" >/dev/null)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/sysroot; done
echo "device deps: $(du -sh .deps/sysroot | cut -f1) in .deps/sysroot"
