#!/usr/bin/env python3
"""Compiles one of MLX's run-time (NVRTC) kernel modules without a GPU, as
MLX 0.32.4's jit_module.cpp does on the GPU host: the feasibility probe
behind docs/cuda.md "Kernels compiled at run time".

    python3 scripts/gpu/nvrtc_probe.py LIBMLX NVRTC_SITE SOURCE NAMES OUT [ARCH]

LIBMLX      the CUDA wheel's mlx/lib/libmlx.so (its jit_source_* symbols
            hold every module source and device header)
NVRTC_SITE  an unpacked nvidia-cuda-nvrtc + nvidia-cuda-runtime cu13 wheel
            (site/nvidia/cu13/{lib,include}); run with LD_LIBRARY_PATH set
            to its lib/ so NVRTC finds libnvrtc-builtins
SOURCE      the module's source symbol, e.g. qmm_naive or gather
NAMES       a cached NAME.txt from the GPU host (kernel name expressions,
            one per line, before a tab)
OUT         where the cubin goes; with a .ptx suffix, a NAME.txt of the
            kernels' lowered names is written beside it, which makes OUT's
            folder an MLX_PTX_CACHE_DIR that MLX loads instead of compiling
ARCH        default sm_90a (MLX adds "a" from compute capability 9)
"""
import ctypes
import os
import re
import subprocess
import sys
import time

HEADERS = ['atomic_ops', 'binary_ops', 'cast_op', 'config', 'complex', 'cute_dequant', 'fp16_math',
           'gemm_sm70', 'hadamard', 'indexing', 'qmm_naive', 'qmm_sm80', 'qmm_sm90', 'scatter_ops',
           'unary_ops', 'ternary_ops', 'utils']


def jit_sources(lib):
    """{name: bytes} of every jit_source_NAME symbol in libmlx."""
    sections = []
    for line in subprocess.run(['readelf', '-SW', lib], capture_output=True, text=True).stdout.splitlines():
        m = re.match(r'\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)', line)
        if m:
            sections.append(tuple(int(m.group(i), 16) for i in (2, 3, 4)))
    data = open(lib, 'rb').read()

    def offset(addr):
        for va, off, size in sections:
            if va <= addr < va + size:
                return addr - va + off
        raise ValueError(hex(addr))

    out = {}
    for line in subprocess.run(['nm', lib], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        m = len(parts) == 3 and re.search(r'jit_source_(\w+?)E$', parts[2])
        if m:
            at = offset(int(parts[0], 16))
            out[m.group(1)] = data[at:data.find(b'\0', at)]
    return out


def main():
    lib, site, source, names_path, out = sys.argv[1:6]
    arch = sys.argv[6] if len(sys.argv) > 6 else 'sm_90a'
    sources = jit_sources(lib)
    nvrtc = ctypes.CDLL(os.path.join(site, 'nvidia/cu13/lib/libnvrtc.so.13'))
    names = [line.split('\t')[0] for line in open(names_path).read().splitlines() if line]
    headers = [sources[h] for h in HEADERS]
    include_names = [('mlx/backend/cuda/device/' + ('config.h' if h == 'config' else h + '.cuh')).encode()
                     for h in HEADERS]
    prog = ctypes.c_void_p()
    n = len(headers)
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), sources[source], b'module.cu', n,
                                    (ctypes.c_char_p * n)(*headers), (ctypes.c_char_p * n)(*include_names)) == 0
    for name in names:
        assert nvrtc.nvrtcAddNameExpression(prog, name.encode()) == 0
    include = os.path.join(os.path.dirname(os.path.dirname(lib)), 'include')
    opts = [b'--device-as-default-execution-space', f'--gpu-architecture={arch}'.encode(),
            f'--include-path={include}'.encode(), f'--include-path={include}/cccl'.encode(),
            f'--include-path={site}/nvidia/cu13/include'.encode()]
    start = time.time()
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    print(f'{source}: NVRTC status {status} in {time.time() - start:.1f} s')
    if status != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode())
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    open(out, 'wb').write(cubin.raw)
    print(f'{out}: {size.value} bytes')
    if out.endswith('.ptx'):
        lines = []
        for name in names:
            lowered = ctypes.c_char_p()
            assert nvrtc.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(lowered)) == 0
            lines.append(f'{name}\t{lowered.value.decode()}\n')
        open(out[:-len('.ptx')] + '.txt', 'w').write(''.join(lines))


if __name__ == '__main__':
    main()
