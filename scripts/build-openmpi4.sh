#!/usr/bin/env bash
# Builds Open MPI 4.1.4 from its release source, as the MindSpore GPU and Ascend
# tutorials do (./configure --prefix=...; make; make install), for the tests of a
# source build under mslaunch (tests/test_ompi_source.py): such a build embeds
# PMIx 3.2.3 with renamed symbols and brings no libpmix.so of its own.
#
#   bash scripts/build-openmpi4.sh [PREFIX]
#
# PREFIX defaults to $MSLAUNCH_TEST_CACHE/openmpi-4.1.4 (MSLAUNCH_TEST_CACHE:
# ~/.cache/mslaunch-tests); nothing is done when PREFIX already holds the build.
# The source is the upstream release tarball as Debian's archive carries it
# (openmpi_4.1.4.orig.tar.xz), checked against the digest Debian publishes.
set -euo pipefail
prefix=${1:-${MSLAUNCH_TEST_CACHE:-$HOME/.cache/mslaunch-tests}/openmpi-4.1.4}
if [ -e "$prefix/.built" ]; then
    exit 0
fi
url=http://deb.debian.org/debian/pool/main/o/openmpi/openmpi_4.1.4.orig.tar.xz
sha256=ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "scripts/build-openmpi4.sh: building Open MPI 4.1.4 from source into $prefix (about 8 minutes on 2 cores)"
python3 - "$url" "$work/openmpi.tar.xz" "$sha256" <<'PY'
import hashlib, sys, urllib.request
url, path, want = sys.argv[1:]
with urllib.request.urlopen(url, timeout=120) as r, open(path, "wb") as f:
    f.write(r.read())
got = hashlib.sha256(open(path, "rb").read()).hexdigest()
if got != want:
    sys.exit(f"scripts/build-openmpi4.sh: {url}: sha256 {got}, want {want}")
PY
tar -xJf "$work/openmpi.tar.xz" -C "$work"
cd "$work/openmpi-4.1.4"
# Fortran and OpenSHMEM play no part in the tests; the rest is the default build.
./configure --prefix="$prefix" --disable-mpi-fortran --disable-oshmem > "$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log" >&2; exit 1; }
make -j"$(nproc)" > "$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
make install > "$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
touch "$prefix/.built"
echo "scripts/build-openmpi4.sh: Open MPI 4.1.4 is in $prefix"
