#!/usr/bin/env bash
# Builds Open MPI 4.1.4 from its release source, as the MindSpore GPU and Ascend
# tutorials do (./configure --prefix=...; make; make install), for the tests of a
# source build under mslaunch (tests/system/openmpi/test_ompi_source.py): such a
# build embeds PMIx 3.2.3 with renamed symbols and brings no libpmix.so of its own.
#
#   bash scripts/build-openmpi4.sh [PREFIX]
#
# PREFIX defaults to $MSLAUNCH_TEST_CACHE/openmpi-4.1.4 (MSLAUNCH_TEST_CACHE:
# ~/.cache/mslaunch-tests); nothing is done when PREFIX already holds the build.
# The source is the upstream release tarball as Debian's source package carries
# it (openmpi_4.1.4.orig.tar.xz, fetched with apt-get source), checked against
# its known digest.
set -euo pipefail
prefix=${1:-${MSLAUNCH_TEST_CACHE:-$HOME/.cache/mslaunch-tests}/openmpi-4.1.4}
if [ -e "$prefix/.built" ]; then
    exit 0
fi
sha256=ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "scripts/build-openmpi4.sh: building Open MPI 4.1.4 from source into $prefix (about 8 minutes on 2 cores)"
# apt-get source, with the source indexes of the system's own Debian archives
# (deb-src beside each deb entry) kept in a private directory: the system's
# apt configuration and package lists are left as they are.
apt_dir="$work/apt"
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$work/src"
if [ -e /etc/apt/sources.list ]; then
    sed -n 's/^deb[[:space:]]/deb-src /p' /etc/apt/sources.list > "$apt_dir/sources.list"
else
    : > "$apt_dir/sources.list"
fi
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [ -e "$f" ] || continue
    case "$f" in
    *.sources) sed 's/^Types:.*/Types: deb-src/' "$f" ;;
    *) sed -n 's/^deb[[:space:]]/deb-src /p' "$f" ;;
    esac > "$apt_dir/sources.list.d/$(basename "$f")"
done
apt_opts=(-q -o "Dir::Etc::SourceList=$apt_dir/sources.list"
          -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
          -o "Dir::State::Lists=$apt_dir/lists"
          -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
[ "$(id -u)" = 0 ] && apt_opts+=(-o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update > "$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; exit 1; }
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only openmpi) >> "$work/apt.log" 2>&1 \
    || { cat "$work/apt.log" >&2; exit 1; }
tarball="$work/src/openmpi_4.1.4.orig.tar.xz"
if [ ! -e "$tarball" ]; then
    echo "scripts/build-openmpi4.sh: Debian's openmpi source package is not 4.1.4 here:" \
         "$(ls "$work/src")" >&2
    exit 1
fi
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
    echo "scripts/build-openmpi4.sh: $tarball: sha256 $got, want $sha256" >&2
    exit 1
fi
tar -xJf "$tarball" -C "$work"
cd "$work/openmpi-4.1.4"
# Fortran and OpenSHMEM play no part in the tests; the rest is the default build.
./configure --prefix="$prefix" --disable-mpi-fortran --disable-oshmem > "$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log" >&2; exit 1; }
make -j"$(nproc)" > "$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
make install > "$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
touch "$prefix/.built"
echo "scripts/build-openmpi4.sh: Open MPI 4.1.4 is in $prefix"
