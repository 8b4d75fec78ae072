#!/usr/bin/env python3
# The fixed costs of a fresh CUDA process on the lent NVIDIA machine, the
# floor under `mlxcel run`'s "ready" time (docs/cuda.md "Reproducible kernel
# sections, and where the first token's time goes"):
#
#   python3 scripts/gpu/init_probe.py "$(python3 -c 'import nvidia,os;print(os.path.dirname(list(nvidia.__path__)[0]))')"
#
# SITE is the folder holding nvidia/ (the machine's CUDA 13 wheels). Times
# the driver's initialisation and primary context, then cuBLAS, cuBLASLt
# and cuDNN handles (each library's first call), through ctypes.
import ctypes, glob, os, sys, time

site = sys.argv[1]
def lib(name):
    return ctypes.CDLL(glob.glob(os.path.join(site, "nvidia", "**", name), recursive=True)[0])
t = time.perf_counter
t0 = t()
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
t1 = t()
dev = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
free = ctypes.c_size_t(); total = ctypes.c_size_t(); cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
t2 = t()
rt = lib("libcudart.so.13"); rt.cudaFree(None); t3 = t()
cublas = lib("libcublas.so.13"); t4 = t()
h = ctypes.c_void_p(); assert cublas.cublasCreate_v2(ctypes.byref(h)) == 0; t5 = t()
lt = lib("libcublasLt.so.13"); hl = ctypes.c_void_p(); assert lt.cublasLtCreate(ctypes.byref(hl)) == 0; t6 = t()
cudnn = lib("libcudnn.so.9"); t7 = t()
hd = ctypes.c_void_p(); r = cudnn.cudnnCreate(ctypes.byref(hd)); t8 = t()
ms = lambda a, b: f"{(b - a) * 1e3:.1f} ms"
print(f"cuInit {ms(t0, t1)}; primary context {ms(t1, t2)}; cudart first call {ms(t2, t3)}")
print(f"load cuBLAS {ms(t3, t4)}, cublasCreate {ms(t4, t5)}; cublasLtCreate {ms(t5, t6)}")
print(f"load cuDNN {ms(t6, t7)}, cudnnCreate {ms(t7, t8)} (status {r})")
