#!/usr/bin/env bash
# Unpacks the TileLang site that ../shared/device/pack-tilelang.sh packs
# (.device/tl_site.tar.xz) into /tmp/site, for the device scripts (tools/gpu_all.sh,
# tools/gpu_sanitize.sh; they put /tmp/site on PYTHONPATH). Nothing to do when it is
# unpacked already (a warm machine); exit status 1 when it cannot be unpacked.
set -u
[ -d /tmp/site/tilelang ] && exit 0
mkdir -p /tmp/site && tar xJf .device/tl_site.tar.xz -C /tmp/site \
  && ln -sf libz3.so.4.15 /tmp/site/z3/lib/libz3.so || exit 1
