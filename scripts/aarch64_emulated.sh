#!/usr/bin/env bash
# fss's kernel-equivalence tests on an emulated aarch64 CPU with the ARMv8 crypto extension, with the
# "aarch64" kernel tier forced (FSS_BACKEND=aarch64). Not part of the normal pytest run: under
# emulation numba compiles and runs 10-50x slower. It proves that the aarch64 tier compiles and is
# bit-identical to the portable one; it says nothing about its speed (that needs a real ARM machine).
#
#   sudo scripts/aarch64_emulated.sh                 # the kernel-equivalence tests (below)
#   sudo scripts/aarch64_emulated.sh tests/fss_tests # everything in tests/fss_tests (hours under emulation)
#   sudo scripts/aarch64_emulated.sh tests/fss_tests/test_backend.py -k 17   # any pytest arguments
#
# The kernel-equivalence tests, run when no argument is given: every fused kernel (gen, eval,
# eval_sum at one and at many points, widths 1-5, DCF and DPF, 7- to 64-bit payloads, 1-100 keys)
# against the portable backend (test_backend.py), the known-answer vectors on every tier
# (test_vectors.py), and eval_grid's kernels against the portable one (test_eval_grid.py's
# test_every_backend_equals_portable). Under qemu a kernel takes 20-90 s to compile, so even these
# take an hour or more; numba's cache in the root keeps them for the next run of unchanged sources.
#
# What it does (Debian/Ubuntu host, root, network to the Debian mirror and PyPI):
#   1. installs qemu-user-static and debootstrap (apt) if missing;
#   2. registers qemu-aarch64-static with binfmt_misc (flag F: the interpreter is opened now, so it
#      also works inside the chroot); if binfmt_misc cannot be mounted or written, it stops and says so;
#   3. makes an arm64 Debian root with debootstrap (once; $AARCH64_ROOT, default /var/tmp/fss-aarch64-root);
#   4. makes a venv there with the host's versions of numpy, numba, llvmlite, pycryptodome, pytest
#      and hypothesis (aarch64 wheels from PyPI);
#   5. copies fss/ and the fss tests of this working tree into it and runs pytest in the chroot.
#
# qemu 7.2 (Debian 12) shows the host's /proc/cpuinfo to the guest, and LLVM reads an aarch64 CPU's
# features from there, so it would find no "aes"; the kernel's AT_HWCAP (which qemu does emulate)
# has it. The run therefore tells numba the CPU's features (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES,
# which fss._aes also reads); on a real ARM machine nothing of this is needed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${AARCH64_ROOT:-/var/tmp/fss-aarch64-root}
SUITE=${AARCH64_SUITE:-bookworm}
MIRROR=${AARCH64_MIRROR:-http://deb.debian.org/debian}
HOST_PY=${HOST_PY:-$REPO/.venv/bin/python}
CPU_NAME=${AARCH64_CPU_NAME:-cortex-a72}
CPU_FEATURES=${AARCH64_CPU_FEATURES:-+neon,+fp-armv8,+aes,+sha2,+crc}

say() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'aarch64_emulated.sh: %s\n' "$*" >&2; exit 3; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, binfmt_misc)"
START=$(date +%s)

# 1. tools
if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing qemu-user-static and debootstrap"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static debootstrap
fi
QEMU=$(command -v qemu-aarch64-static)

# 2. binfmt_misc: arm64 ELF files run through qemu, also inside the chroot (flag F)
BINFMT=/proc/sys/fs/binfmt_misc
if [ ! -e "$BINFMT/register" ]; then
  mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null \
    || die "binfmt_misc is not mounted and cannot be mounted here ($BINFMT): a container without the
capability, or a kernel without CONFIG_BINFMT_MISC. Run this on a VM or host where it can be, or
start the guest python explicitly (qemu-aarch64-static -L \$ROOT \$ROOT/usr/bin/python3), which
debootstrap's second stage and the tests' subprocesses cannot do."
fi
if [ -e "$BINFMT/qemu-aarch64" ] && ! grep -q '^flags:.*F' "$BINFMT/qemu-aarch64"; then
  echo -1 > "$BINFMT/qemu-aarch64"  # registered without F (the chroot could not find the interpreter)
fi
if [ ! -e "$BINFMT/qemu-aarch64" ]; then
  magic='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  echo ":qemu-aarch64:M::$magic:$mask:$QEMU:OCF" > "$BINFMT/register" \
    || die "cannot register qemu-aarch64 with binfmt_misc ($BINFMT/register refused the write)"
fi
say "binfmt_misc: $(tr '\n' ' ' < "$BINFMT/qemu-aarch64")"

# 3. the arm64 root
if [ ! -e "$ROOT/.fss-root-ready" ]; then
  say "debootstrap $SUITE arm64 into $ROOT (from $MIRROR)"
  rm -rf "$ROOT"
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$ROOT" "$MIRROR"
  touch "$ROOT/.fss-root-ready"
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# the host's CA bundle (it may hold a TLS-inspecting proxy's CA that the guest's bundle lacks), for pip
HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$HOST_CA" ] && cp "$HOST_CA" "$ROOT/etc/ssl/certs/host-ca-bundle.crt"

mounted=()
cleanup() { for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
for m in proc sys dev; do
  if ! mountpoint -q "$ROOT/$m"; then
    case $m in proc) mount -t proc proc "$ROOT/proc" ;; *) mount --rbind "/$m" "$ROOT/$m" ;; esac
    mounted=("$ROOT/$m" "${mounted[@]}")
  fi
done
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
say "guest: $(in_root uname -m), $(in_root python3 --version)"

# 4. the venv, with the host's versions
pins=$("$HOST_PY" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("numpy", "numba", "llvmlite", "pycryptodome", "pytest", "hypothesis")))
EOF
)
if [ ! -e "$ROOT/opt/venv/.fss-pins" ] || [ "$(cat "$ROOT/opt/venv/.fss-pins")" != "$pins" ]; then
  say "venv with $pins"
  in_root python3 -m venv /opt/venv
  in_root PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
    /opt/venv/bin/python -m pip install -q --only-binary=:all: $pins
  echo "$pins" > "$ROOT/opt/venv/.fss-pins"
fi

# 5. this working tree's fss and its tests, then pytest with the aarch64 tier forced
say "copying fss/ and tests/fss_tests from $REPO"
rm -rf "$ROOT/opt/src"
mkdir -p "$ROOT/opt/src/tests"
cp -r "$REPO/fss" "$ROOT/opt/src/fss"
cp -r "$REPO/tests/fss_tests" "$REPO/tests/vectors" "$REPO/tests/conftest.py" "$REPO/tests/helpers.py" "$ROOT/opt/src/tests/"
find "$ROOT/opt/src" -name __pycache__ -prune -exec rm -rf {} +
printf '[pytest]\ntestpaths = tests\n' > "$ROOT/opt/src/pytest.ini"

if [ $# = 0 ]; then
  set -- tests/fss_tests/test_backend.py tests/fss_tests/test_vectors.py \
    tests/fss_tests/test_eval_grid.py::test_every_backend_equals_portable
fi
say "pytest $* (FSS_BACKEND=aarch64, NUMBA_CPU_NAME=$CPU_NAME, NUMBA_CPU_FEATURES=$CPU_FEATURES)"
set +e
in_root FSS_BACKEND=aarch64 NUMBA_CPU_NAME="$CPU_NAME" NUMBA_CPU_FEATURES="$CPU_FEATURES" \
  NUMBA_CACHE_DIR=/opt/numba-cache PYTHONPATH=/opt/src PYTHONDONTWRITEBYTECODE=1 \
  sh -c 'cd /opt/src && python - <<EOF
from fss import backend, _aes
print("tiers:", backend.available(), "chosen:", backend.current(), "features:", sorted(_aes.host_features() & {"aes", "neon", "sha2"}))
EOF
python -m pytest -q -p no:cacheprovider -rfE --durations=15 "$@"' sh "$@"
rc=$?
set -e
say "pytest exit code $rc; wall time of the whole script $(( $(date +%s) - START )) s"
exit $rc
