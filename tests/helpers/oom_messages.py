"""Real out-of-memory messages, as torch and the trainer print them (the parser's tests and the oom event's)."""

from __future__ import annotations

# torch >= 2.1 (c10 CUDACachingAllocator), with one other process on the device
CURRENT = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which "
           "10.75 MiB is free. Process 1234 has 2.00 GiB memory in use. Including non-PyTorch memory, this process "
           "has 77.13 GiB memory in use. Of the allocated memory 76.20 GiB is allocated by PyTorch, and 401.45 MiB "
           "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
           "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# torch 2.1 spelled "capacty"; with a memory-fraction cap and CUDA-graph pools
TORCH21 = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacty of 23.65 GiB of which "
           "1.50 GiB is free. 8.00 GiB allowed; Of the allocated memory 7.50 GiB is allocated by PyTorch, with "
           "512.00 MiB allocated in private pools (e.g., CUDA Graphs), and 100.00 KiB is reserved by PyTorch but "
           "unallocated.")
# torch < 2.1
LEGACY = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.20 GiB already "
          "allocated; 10.75 MiB free; 14.50 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
          "memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
          "PYTORCH_CUDA_ALLOC_CONF")
# the MPS allocator (Apple GPUs): the same powers of 1024, labelled KB / MB / GB
MPS = ("MPS backend out of memory (MPS allocated: 17.50 GB, other allocations: 512.00 MB, max allowed: 18.13 GB). "
       "Tried to allocate 256.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to lift the upper limit "
       "for memory allocations (may cause system failure).")
