"""Level 5's kernels: CUDA C++ built with torch.utils.cpp_extension.load_inline.

    common.cuh               what every kernel file shares (dtype codes, status codes,
                             fp32 conversions, warp/block reductions, dtype dispatch)
    <name>.cu                pure CUDA (no torch header): a ladder of kernel versions and
                             `extern "C"` launchers on raw pointers, sizes, strides, a stream
    binding.cpp              the one C++ unit that includes torch headers (a small prelude)
    <component>_binding.cpp  each component's op schemas and CUDA implementations, appended
                             to the prelude by the loader
    <component>.py           the Python side: versions, fake/autograd registration, the entry
                             point levels/cuda.py calls
    build.py                 the loader: builds once per torch/CUDA/GPU into a per-user cache,
                             loads the ops into torch.ops.levels_cuda; ptxas reports with nvcc

Importing this package imports nothing heavy and builds nothing: `build.ops()` does, on
first use.
"""
