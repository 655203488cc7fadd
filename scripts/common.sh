# shellcheck shell=bash
# Shared set-up for scripts/test and scripts/demo: sourced, never run. It moves to the repo
# root and makes sure the build dependencies are present, installing only what is missing.

weft_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$weft_root" || exit 1

# Debian packages weft's build needs. Later needs (openmpi-bin libopenmpi-dev, ...) go here;
# a package without a special case in weft_package_present is checked with dpkg.
WEFT_APT_PACKAGES="cmake ninja-build g++ libgtest-dev libbenchmark-dev openmpi-bin libopenmpi-dev libgloo-dev
  python3-matplotlib libopenblas-dev clang-format"

# shellcheck disable=SC2034 # used by the scripts that source this file
weft_jobs="$(nproc 2>/dev/null || echo 2)"

weft_log() {
  printf '[weft] %s\n' "$*" >&2
}

weft_error() {
  printf '[weft] error: %s\n' "$*" >&2
}

weft_die() {
  weft_error "$@"
  exit 1
}

weft_dpkg_installed() {
  command -v dpkg-query >/dev/null 2>&1 &&
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# Whether find_package(<name> CONFIG) would find a package config in a standard prefix.
weft_cmake_config_present() {
  local name="$1" dir
  for dir in /usr/lib/*/cmake/"$name" /usr/lib/cmake/"$name" /usr/share/cmake/"$name" \
    /usr/local/lib/*/cmake/"$name" /usr/local/lib/cmake/"$name"; do
    [[ -d "$dir" ]] && return 0
  done
  return 1
}

# A tool or library counts as present if it is usable, however it was installed (a
# source-built googletest in /usr/local is fine); dpkg is the fallback for the rest.
weft_package_present() {
  case "$1" in
    cmake) command -v cmake >/dev/null 2>&1 ;;
    ninja-build) command -v ninja >/dev/null 2>&1 ;;
    g++) command -v g++ >/dev/null 2>&1 ;;
    clang-format) command -v clang-format-14 >/dev/null 2>&1 || command -v clang-format >/dev/null 2>&1 ;;
    libgtest-dev)
      { [[ -f /usr/include/gtest/gtest.h ]] || [[ -f /usr/local/include/gtest/gtest.h ]]; } &&
        { weft_cmake_config_present GTest || weft_dpkg_installed libgtest-dev; } ;;
    libbenchmark-dev)
      { [[ -f /usr/include/benchmark/benchmark.h ]] ||
        [[ -f /usr/local/include/benchmark/benchmark.h ]]; } &&
        weft_cmake_config_present benchmark ;;
    *) weft_dpkg_installed "$1" ;;
  esac
}

# The host of apt's first source (deb822 .sources or one-line .list), or nothing.
weft_apt_mirror() {
  local host
  host="$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    grep -oE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^/[:space:]]+' |
    head -1 | sed -E 's|.*https?://||')"
  [[ -n "$host" ]] && printf '%s\n' "$host"
}

# Whether <host> answers on port 80 within 5 s (bash's /dev/tcp: no curl or nc needed).
weft_reachable() {
  timeout 5 bash -c "exec 3<>/dev/tcp/$1/80" 2>/dev/null
}

# Installs what is missing of WEFT_APT_PACKAGES. Returns non-zero, having said why, when it
# cannot (no root or sudo, no apt-get, a package still missing after apt-get install), so that
# the caller decides: `weft_ensure_dependencies || exit $?` to stop there. A failing apt-get
# (its own messages say why) does not end it: what is still missing afterwards is what counts.
weft_ensure_dependencies() {
  local missing=() pkg
  for pkg in $WEFT_APT_PACKAGES; do
    weft_package_present "$pkg" || missing+=("$pkg")
  done
  if [[ -n "${CXX:-}" ]] && ! command -v "${CXX%% *}" >/dev/null 2>&1; then
    weft_error "CXX=$CXX is not on PATH; install it or unset CXX"
    return 1
  fi
  ((${#missing[@]} == 0)) && return 0

  weft_log "missing: ${missing[*]}"
  local install="apt-get install -y --no-install-recommends ${missing[*]}"
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      weft_log "not root and no password-less sudo; install them with:"
      printf '  sudo apt-get update && sudo %s\n' "$install" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    weft_error "apt-get not found; install the equivalents of: ${missing[*]}"
    return 1
  fi
  # An offline machine (a lent GPU machine reaches nothing outside it): apt-get update would
  # spend minutes on timeouts, and install could find nothing.
  local mirror
  if mirror="$(weft_apt_mirror)" && ! weft_reachable "$mirror"; then
    weft_error "$mirror is out of reach (no network?): not running apt-get; install ${missing[*]} by other means"
    return 1
  fi
  # CI runs without a terminal or stdin: no prompts, ever (exported to apt-get, not the caller).
  local -x DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update || true
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" || true
  for pkg in "${missing[@]}"; do
    if ! weft_package_present "$pkg"; then
      weft_error "$pkg still missing after apt-get install"
      return 1
    fi
  done
}

# Configure <build dir> with Ninja and the given cache options. A folder configured earlier
# with another generator or compiler is reset first: CMake cannot switch either in place,
# and CXX is only read on the first configure.
weft_configure() {
  local dir="$1"
  shift
  local cache="$dir/CMakeCache.txt"
  if [[ -f "$cache" ]]; then
    local generator cached want cxx="${CXX:-c++}"
    generator="$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache")"
    cached="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache")"
    want="$(command -v "${cxx%% *}" 2>/dev/null || true)"
    if [[ "$generator" != Ninja ]] ||
      { [[ -n "$want" && -n "$cached" ]] &&
        [[ "$(readlink -f "$cached")" != "$(readlink -f "$want")" ]]; }; then
      weft_log "$dir was configured with ${generator:-?} / ${cached:-?}; reconfiguring from scratch"
      rm -rf "$cache" "$dir/CMakeFiles"
    fi
  fi
  cmake -S "$weft_root" -B "$dir" -G Ninja "$@"
}

# nvcc where the CUDA toolkit installs it, when it is not on PATH: CMake then finds it, and
# WEFT_ENABLE_CUDA turns on by itself.
if ! command -v nvcc >/dev/null 2>&1 && [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

# Configure <build dir> for the GPU checks and build the CUDA tests, benchmarks and samples
# with every core; the logs go to <log dir>. Used by scripts/gpu-check and scripts/gpu-bundle.
weft_gpu_build() {
  local dir="$1" logs="$2"
  weft_configure "$dir" -DCMAKE_BUILD_TYPE=Release -DWEFT_ENABLE_CUDA=ON -DWEFT_BUILD_TESTS=ON \
    -DWEFT_BUILD_BENCHMARKS=ON -DWEFT_BUILD_SAMPLES=ON >"$logs/configure.log" 2>&1 ||
    { tail -30 "$logs/configure.log"; weft_die "configure failed (log: $logs/configure.log)"; }
  local targets=(tests/cuda/all benchmarks/cuda/all)
  [[ -d samples/03_cuda_existing_program ]] && targets+=(samples/all)
  cmake --build "$dir" -j "$weft_jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1 ||
    { tail -30 "$logs/build.log"; weft_die "build failed (log: $logs/build.log)"; }
}

# The plain build's options: shared by scripts/test and scripts/demo so that neither
# reconfigures the other's build/.
# shellcheck disable=SC2034
WEFT_PLAIN_OPTIONS=(-DCMAKE_BUILD_TYPE=Release -DWEFT_WARNINGS_AS_ERRORS=ON -DWEFT_SANITIZE=)
