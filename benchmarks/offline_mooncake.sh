#!/usr/bin/env bash
# Runs a command with Mooncake's transfer engine importable, on a host that
# cannot reach PyPI (the GPU machine), from the files `make offline-wheels`
# puts in build/wheels (git-ignored, carried to that host beside the tree):
#   bash benchmarks/offline_mooncake.sh python3 benchmarks/bench_disagg.py --rounds 3 --json
# - mooncake_transfer_engine_non_cuda-<version>-cpXY-*.whl: the wheel for
#   the host's CPython (one wheel is 44 MiB: carry the one for that Python);
#   installed with pip --no-index --no-deps --target build/mooncake-site.
#   Its Python needs (msgpack, requests, aiohttp) are not installed: the
#   transfer engine does not import them.
# - mooncake-syslibs-x86_64.tar.xz: the system libraries the engine links
#   (libibverbs, libnuma, libcurl and theirs; Debian 12's, glibc >= 2.34).
#   Only those the host lacks are used (linked into build/mooncake-site/lib,
#   put on LD_LIBRARY_PATH), so none shadows the host's own.
# Where `import mooncake.engine` works already, the command runs as it is.
set -euo pipefail
WHEELS=${WHEELS:-build/wheels}
SITE=$(realpath -m "${MOONCAKE_SITE:-build/mooncake-site}")
PYTHON=${PYTHON:-python3}
export MC_LOG_LEVEL=${MC_LOG_LEVEL:-ERROR}
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }

fail() { echo "offline_mooncake: $*" >&2; exit 2; }

if ! "$PYTHON" -c "import mooncake.engine" 2>/dev/null; then
  tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  wheels=("$WHEELS"/mooncake_transfer_engine_non_cuda-*-"$tag"-"$tag"-*.whl)
  [ -e "${wheels[0]}" ] || fail "no mooncake-transfer-engine-non-cuda wheel for $tag ($("$PYTHON" -V)) in $WHEELS;" \
    "make offline-wheels OFFLINE_PY=${tag:2:1}.${tag:3} fetches it where PyPI is reachable"
  [ ${#wheels[@]} -eq 1 ] || fail "one wheel for $tag expected in $WHEELS, found: ${wheels[*]}"
  syslibs=$WHEELS/mooncake-syslibs-x86_64.tar.xz
  [ -e "$syslibs" ] || fail "$syslibs is missing; make offline-wheels makes it"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[0]}"
  rm -rf "$SITE/syslibs" "$SITE/lib"
  mkdir -p "$SITE/syslibs" "$SITE/lib"
  "$PYTHON" - "$syslibs" "$SITE/syslibs" <<'PY'  # Python's tarfile: the host may have no xz
import sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    archive.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
PY
  # a library the host lacks may need others it lacks: look again until ldd finds them all
  for _ in 1 2 3 4 5 6; do
    missing=$(LD_LIBRARY_PATH="$SITE/lib" ldd "$SITE/mooncake/engine.so" | awk '/not found/ {print $1}' | sort -u)
    [ -n "$missing" ] || break
    for lib in $missing; do
      [ -e "$SITE/syslibs/lib/$lib" ] || fail "the host lacks $lib, which $syslibs does not hold"
      ln -sf "$SITE/syslibs/lib/$lib" "$SITE/lib/$lib"
      echo "offline_mooncake: $lib from $syslibs" >&2
    done
  done
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$SITE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$PYTHON" -c "import mooncake.engine" || fail "mooncake.engine does not import from $SITE"
fi
exec "$@"
