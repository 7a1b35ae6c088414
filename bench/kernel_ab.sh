#!/usr/bin/env bash
# A/B three compile-time variants of the kernel: bench/kernel_ab.sh "FLAGS0" "FLAGS1" "FLAGS2" [REPEATS] [MAX_M] [CHAIN] [SHAPE]
# e.g. bench/kernel_ab.sh "" "-DLEAD=2" "-DPF_HINT=_MM_HINT_T0" 11 6   (the macros are at the top of linear.c)
# Run it on a quiet machine: the three variants share the memory bus with everything else.
# SRC0=path/to/linear.c builds v0 from another version of the file (e.g. `git show HEAD~1:...`), for an
# A/B of two versions; the packed layout must be the same.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src="$here/../sglang_ssd/cpu/csrc/linear.c"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=("${1:-}" "${2:-}" "${3:-}")
for v in 0 1 2; do
    file="$src"
    [ "$v" = 0 ] && [ -n "${SRC0:-}" ] && file="$SRC0"
    # shellcheck disable=SC2086  # the flags are a word list on purpose
    gcc -O3 -ffp-contract=off -fno-math-errno -c ${flags[$v]} -Dssd_linear_avx2=lin_v$v -Dssd_pack=pack_v$v \
        -Dssd_packed_size=pk_size_v$v -Dssd_linear_portable=port_v$v -Dssd_cpu_has_avx2_fma=has_v$v -Dssd_linear_avx512=z512_v$v -Dssd_use_avx512=use512_v$v -Dssd_lead_bytes=lead_v$v \
        "$file" -o "$tmp/l$v.o"
    echo "v$v: ${flags[$v]:-(default)} ($file)"
done
gcc -O2 "$here/csrc/kernel_ab.c" "$tmp"/l0.o "$tmp"/l1.o "$tmp"/l2.o -o "$tmp/kernel_ab"
"$tmp/kernel_ab" "${4:-9}" "${5:-8}" "${6:-1}" ${7:+"$7"}
