"""Build DeepSpeed's CPU extensions once, at install time, rather than inside the first
trial that needs them.

On a CPU machine DeepSpeed JIT-compiles its shared-memory collectives and its fused Adam
the first time an engine starts (2 min 11 s on 2 cores here), then loads them from
``~/.cache/torch_extensions``. The test suite's first ZeRO test paid for that; building
them with the install keeps that minute or two out of every measurement. On a GPU
machine DeepSpeed picks its CUDA builders itself: nothing to do here.

    python scripts/build_deepspeed_ops.py
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    try:
        import torch
        from deepspeed.ops.op_builder.cpu import FusedAdamBuilder, ShareMemCommBuilder
    except ImportError as exc:
        print(f"build_deepspeed_ops: DeepSpeed's CPU builders are not importable ({exc}); nothing built")
        return 0
    if torch.cuda.is_available():
        print("build_deepspeed_ops: CUDA is present; DeepSpeed builds its CUDA ops when it needs them")
        return 0
    for builder in (ShareMemCommBuilder, FusedAdamBuilder):
        start = time.perf_counter()
        builder().load(verbose=False)
        print(f"build_deepspeed_ops: {builder.NAME} ready ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
