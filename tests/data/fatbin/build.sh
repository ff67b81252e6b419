#!/usr/bin/env bash
# Rebuild the committed fatbin fixtures of tests/test_elf.py from kernel.cu (needs nvcc; CUDA 13.0 used).
#
# Why these architectures: libdevice.so holds one entry of each kind the reader must tell
# apart: plain SASS (sm_90), arch-specific SASS (sm_90a, flag 0x100000), arch-specific SASS of
# another major with a named entry header (sm_120a, 112-byte header) and PTX (compute_90,
# compressed by default). libdevice-sm80.so holds compressed SASS (-compress-all, flag 0x8000)
# for sm_80 and a family-specific target (sm_100f, flag 0x200000).
# -cudart none, -s and -z noseparate-code keep the files a few KB.
set -euo pipefail
cd "$(dirname "$0")"
common=(-shared -Xcompiler -fPIC -Xlinker -s,-z,noseparate-code -cudart none)
nvcc "${common[@]}" \
    -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_90a,code=sm_90a \
    -gencode arch=compute_120a,code=sm_120a \
    -gencode arch=compute_90,code=compute_90 \
    -o libdevice.so kernel.cu
nvcc "${common[@]}" -Xfatbin -compress-all \
    -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_100f,code=sm_100f \
    -o libdevice-sm80.so kernel.cu
ls -l libdevice.so libdevice-sm80.so
