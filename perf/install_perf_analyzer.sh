#!/usr/bin/env bash
# Install a stock perf_analyzer (Triton's load generator) for this project, under
# <repo>/.tools/perf_analyzer/. Run it through the wrapper perf/perf_analyzer.
#
#   perf/install_perf_analyzer.sh           install (a no-op when already installed)
#   perf/install_perf_analyzer.sh --force   reinstall from scratch
#
# Needs: bash, python3 with pip (or <repo>/.venv), apt-get + dpkg (Debian/Ubuntu), and
# network access to PyPI and a Debian mirror. Root is not needed; nothing is installed
# system-wide (apt only downloads, into a private state directory).
#
# How: the perf-analyzer 2.60.0 wheel from PyPI holds a stock, self-contained
# perf_analyzer binary, but it is built for glibc >= 2.38 (manylinux_2_38) and Debian 12
# has glibc 2.36. So the binary runs under Debian 13 (trixie)'s dynamic loader, libc and
# libstdc++, which are downloaded with `apt-get download` (a private APT configuration
# pointing at trixie; the host's APT state is never touched) and unpacked beside it.
# The wrapper starts the binary through that loader explicitly: nothing else on the
# machine sees those libraries.
#
# Fallback (automatic if the route above fails, or NEREID_PA_ROUTE=tritonclient): the
# perf_analyzer 2.40.0 bundled in the tritonclient==2.40.0 wheel, which runs on the host
# glibc but needs libb64.so.0d (Debian bookworm's libb64-0d) and libcudart.so.12 (from the
# nvidia-cuda-runtime-cu12 wheel; no GPU is needed to run it).
#
# Environment:
#   NEREID_PA_ROUTE      wheel (default: the 2.60 wheel, falling back to tritonclient) |
#                        tritonclient (2.40 only)
#   NEREID_DEBIAN_MIRROR Debian mirror URL (default http://deb.debian.org/debian)
#   NEREID_PA_PYTHON     python used for `pip download` (default: <repo>/.venv/bin/python,
#                        else python3)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
WRAPPER=$HERE/perf_analyzer
DEST=$ROOT/.tools/perf_analyzer          # the installed tree: bin/, lib/, STAMP
CACHE=$ROOT/.tools/cache/perf_analyzer   # downloads and APT state, kept for reinstalls
STAMP_FILE=$DEST/STAMP

PA_VERSION=2.60.0
TC_VERSION=2.40.0
CUDART_SPEC='nvidia-cuda-runtime-cu12>=12.1,<13'
MIRROR=${NEREID_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROUTE=${NEREID_PA_ROUTE:-wheel}
# Bump the "recipe" number when this script changes what it installs.
STAMP_WHEEL="perf-analyzer $PA_VERSION via trixie loader (recipe 1)"
STAMP_TC="tritonclient $TC_VERSION bundled perf_analyzer (recipe 1)"

log() { printf 'install_perf_analyzer: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

case "$ROUTE" in
  wheel) want_stamps=("$STAMP_WHEEL" "$STAMP_TC") ;;   # an installed fallback is accepted too
  tritonclient) want_stamps=("$STAMP_TC") ;;
  *) die "NEREID_PA_ROUTE must be 'wheel' or 'tritonclient', not '$ROUTE'" ;;
esac

# ---- fast path: already installed and runnable ---------------------------------------
if [ "$force" = 0 ] && [ -f "$STAMP_FILE" ]; then
  have=$(cat "$STAMP_FILE")
  for s in "${want_stamps[@]}"; do
    if [ "$have" = "$s" ] && "$WRAPPER" --version >/dev/null 2>&1; then
      log "already installed: $have"
      echo "$WRAPPER"
      exit 0
    fi
  done
fi

[ "$(uname -m)" = x86_64 ] || die "only x86_64 Linux is supported (this is $(uname -m))"
for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || die "$tool is needed (Debian/Ubuntu)"
done

if [ -n "${NEREID_PA_PYTHON:-}" ]; then PY=$NEREID_PA_PYTHON
elif [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -m pip --version >/dev/null 2>&1; then
  PY=$ROOT/.venv/bin/python
else PY=python3
fi
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (set NEREID_PA_PYTHON)"

mkdir -p "$CACHE/wheels"
STAGE=$(mktemp -d "$ROOT/.tools/perf_analyzer.new.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

# pip_download SPEC PLATFORM GLOB: fetch one wheel (no deps) into the cache and print the
# path of the cached wheel matching GLOB (a cached wheel is reused when PyPI is unreachable).
pip_download() {
  local spec=$1 platform=$2 glob=$3
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform "$platform" --dest "$CACHE/wheels" "$spec" 2>&1 \
    | grep -v "^WARNING: Location 'file:" >&2 || true
  # shellcheck disable=SC2012,SC2086  # $glob is a pattern; wheel names are plain
  ls -t "$CACHE"/wheels/$glob 2>/dev/null | head -n 1
}

unzip_to() {  # unzip_to ZIP DIR (python's zipfile: no unzip binary needed)
  mkdir -p "$2" && "$PY" -m zipfile -e "$1" "$2"
}

# apt_fetch SUITE PKG...: download .debs of SUITE (e.g. trixie) with a private APT state
# under $CACHE/apt-SUITE, and unpack them into $STAGE/root-SUITE.
apt_fetch() {
  local suite=$1; shift
  local A=$CACHE/apt-$suite
  mkdir -p "$A/lists/partial" "$A/archives/partial" "$A/debs" "$A/etc/empty.d"
  [ -f "$A/status" ] || : > "$A/status"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" \
    > "$A/etc/sources.list"
  {
    echo "Dir::Etc::SourceList \"$A/etc/sources.list\";"
    echo "Dir::Etc::SourceParts \"$A/etc/empty.d\";"
    echo "Dir::Etc::Preferences \"$A/etc/preferences\";"
    echo "Dir::Etc::PreferencesParts \"$A/etc/empty.d\";"
    echo "Dir::State::Lists \"$A/lists\";"
    echo "Dir::State::status \"$A/status\";"
    echo "Dir::Cache \"$A\";"
    echo 'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";'
    echo 'APT::Architecture "amd64"; APT::Architectures { "amd64"; };'
    echo 'Acquire::Languages "none";'
    echo 'Acquire::Retries "3";'
    echo 'APT::Update::Error-Mode "any";'   # a failed index fetch fails the update
    # as root, apt would drop to user _apt, which cannot write into a root-owned private dir
    [ "$(id -u)" = 0 ] && echo 'APT::Sandbox::User "root";'
  } > "$A/apt.conf"
  log "apt-get update ($suite, private state in $A)"
  APT_CONFIG=$A/apt.conf apt-get -q=2 update || die "apt-get update for $suite failed (mirror $MIRROR)"
  rm -f "$A"/debs/*.deb
  log "apt-get download $*"
  (cd "$A/debs" && APT_CONFIG=$A/apt.conf apt-get -q=2 download "$@") \
    || die "apt-get download $* from $suite failed"
  local d
  for d in "$A"/debs/*.deb; do dpkg-deb -x "$d" "$STAGE/root-$suite"; done
}

# ---- route 1: perf-analyzer 2.60.0 wheel + trixie's loader and libraries -----------------
install_wheel() {
  log "pip download perf-analyzer==$PA_VERSION"
  local whl; whl=$(pip_download "perf-analyzer==$PA_VERSION" manylinux_2_38_x86_64 "perf_analyzer-$PA_VERSION-*.whl")
  [ -n "$whl" ] || { log "perf-analyzer wheel not downloaded"; return 1; }
  unzip_to "$whl" "$STAGE/whl"
  mkdir -p "$STAGE/pa/bin" "$STAGE/pa/lib"
  cp "$STAGE/whl/perf_analyzer/bin/perf_analyzer" "$STAGE/pa/bin/perf_analyzer"
  chmod 755 "$STAGE/pa/bin/perf_analyzer"
  # libc6 brings ld-linux, libc, libm; libssl3t64/zlib1g/libzstd1 are the binary's (and
  # libcrypto's) other needs, taken from trixie too so nothing mixes with the host's glibc.
  apt_fetch trixie libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g libzstd1 || return 1
  local L=$STAGE/root-trixie/usr/lib/x86_64-linux-gnu
  [ -e "$L/ld-linux-x86-64.so.2" ] || { log "no loader in the trixie libc6 package"; return 1; }
  # flat copy of the shared objects, their soname symlinks kept (not gconv/, engines-3/, ...)
  find "$L" -maxdepth 1 \( -type f -o -type l \) -name '*.so*' -exec cp -P -t "$STAGE/pa/lib" {} +
  echo "$STAMP_WHEEL" > "$STAGE/pa/STAMP"
}

# ---- route 2: tritonclient 2.40.0 wheel's bundled perf_analyzer -------------------------
install_tritonclient() {
  log "pip download tritonclient==$TC_VERSION and $CUDART_SPEC"
  local whl cu
  whl=$(pip_download "tritonclient==$TC_VERSION" manylinux1_x86_64 "tritonclient-$TC_VERSION-*.whl")
  cu=$(pip_download "$CUDART_SPEC" manylinux2014_x86_64 "nvidia_cuda_runtime_cu12-12.*.whl")
  [ -n "$whl" ] && [ -n "$cu" ] || { log "wheels not downloaded"; return 1; }
  unzip_to "$whl" "$STAGE/tc"
  unzip_to "$cu" "$STAGE/cu"
  mkdir -p "$STAGE/pa/bin" "$STAGE/pa/lib"
  cp "$STAGE/tc/tritonclient-$TC_VERSION.data/data/bin/perf_analyzer" "$STAGE/pa/bin/perf_analyzer"
  chmod 755 "$STAGE/pa/bin/perf_analyzer"
  cp -L "$STAGE"/cu/nvidia/cuda_runtime/lib/libcudart.so.12 "$STAGE/pa/lib/"
  apt_fetch bookworm libb64-0d || return 1
  cp -L "$STAGE"/root-bookworm/usr/lib/x86_64-linux-gnu/libb64.so.0d "$STAGE/pa/lib/"
  echo "$STAMP_TC" > "$STAGE/pa/STAMP"
}

t0=$(date +%s)
# Each route runs in a background subshell so that `set -e` stays in force inside it
# (it is off in a command tested by `if`), and a failure there cannot kill this script.
ok=0
if [ "$ROUTE" = wheel ]; then
  install_wheel & pid=$!
  if wait "$pid"; then ok=1
  else
    log "WARNING: the perf-analyzer $PA_VERSION route failed; falling back to tritonclient $TC_VERSION"
    rm -rf "$STAGE/pa"
  fi
fi
if [ "$ok" = 0 ]; then
  install_tritonclient & pid=$!
  wait "$pid" || die "could not install perf_analyzer by either route"
fi

# swap the new tree in, then check it through the wrapper
if [ -e "$DEST" ]; then mv "$DEST" "$STAGE/old"; fi
mv "$STAGE/pa" "$DEST"
if ! version=$("$WRAPPER" --version 2>&1); then
  printf '%s\n' "$version" >&2
  rm -f "$STAMP_FILE"
  die "the installed perf_analyzer does not run"
fi
log "$(cat "$STAMP_FILE"): $version ($(( $(date +%s) - t0 ))s)"
echo "$WRAPPER"
