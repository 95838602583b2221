#!/usr/bin/env bash
# Runs a command as it would run on an AVX2-only CPU without bf16, on a machine that has AVX-512:
#
#   tests/as_avx2.sh [--load N] COMMAND [ARG...]
#
# - torch's own kernels: ATEN_CPU_CAPABILITY=avx2 (bf16 then computes in emulation, as on an AVX2 CPU);
# - oneDNN (torch's and OpenVINO's): ONEDNN_MAX_CPU_ISA=AVX2, OpenVINO's own kernels: OV_CPU_MAX_ISA=AVX2,
#   MKL (torch's float matrix products): MKL_ENABLE_INSTRUCTIONS=AVX2
#   (OpenVINO then drops BF16 from its capabilities and runs a bf16 hint in f32, as on an AVX2 CPU);
# - /proc/cpuinfo, read by embedrank (which CPU features `auto` considers, what benchmarks record), has its
#   AVX-512, AVX-VNNI and AMX flags removed, in a mount namespace of this command's own.
# ONNX Runtime's MLAS has no such setting: it still picks its kernels from CPUID.
#
# --load N runs N busy loops beside the command (a laptop with other work running), stopped when it ends.
# Needs root, or unprivileged user namespaces (unshare --map-root-user).
set -euo pipefail

load=0
if [[ "${1:-}" == "--load" ]]; then
    load="$2"
    shift 2
fi
if [[ $# -eq 0 ]]; then
    echo "usage: $0 [--load N] COMMAND [ARG...]" >&2
    exit 2
fi

fake="$(mktemp "${TMPDIR:-/tmp}/cpuinfo-avx2.XXXXXX")"
busy=()
cleanup() {
    for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -f "$fake"
}
trap cleanup EXIT
# every flag of AVX-512, AVX-VNNI and AMX (and AVX512-FP16) goes; avx, avx2, fma and the rest stay
sed -E '/^flags/{s/ (avx512[a-z0-9_]*|avx_vnni[a-z0-9_]*|amx_[a-z0-9_]*|avx_ifma|avx_ne_convert)\b//g}' /proc/cpuinfo > "$fake"
if grep -qE '^flags.*\b(avx512f|amx_tile)\b' "$fake"; then
    echo "$0: could not hide the AVX-512 flags" >&2
    exit 1
fi

for ((i = 0; i < load; i++)); do
    if command -v stress-ng >/dev/null; then
        stress-ng --cpu 1 --quiet &
    else
        sh -c 'while :; do :; done' &
    fi
    busy+=("$!")
done

if [[ $(id -u) -eq 0 ]]; then
    unshare=(unshare --mount --propagation private)
else
    unshare=(unshare --user --map-root-user --mount --propagation private)
fi
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OV_CPU_MAX_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
set +e
if "${unshare[@]}" sh -c 'mount --bind "$0" /proc/cpuinfo' "$fake" 2>/dev/null; then
    "${unshare[@]}" sh -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$fake" "$@"
else  # no mount namespace here (a container without CAP_SYS_ADMIN): the runtimes are capped, /proc/cpuinfo is not
    echo "$0: cannot hide /proc/cpuinfo's flags here (no mount namespace); the runtimes are capped to AVX2" >&2
    "$@"
fi
status=$?
set -e
exit "$status"
