"""Whether a CPU engine runs bfloat16 natively, and the hint to give when it does not.

vLLM on an x86 CPU runs a bfloat16 model in bfloat16 whatever the CPU offers. Without AVX-512 BF16 or AMX
the bfloat16 matmuls are emulated: on an AVX2-only AMD EPYC (docs/PERFORMANCE.md) the bundled tiny model
sampled 2.5x faster with `dtype: float32`, and a 113M model over 5x. The dtype stays the user's choice (it
changes the logprobs a trainer sees), so the engine only says so when it starts.
"""

from __future__ import annotations

import platform
from pathlib import Path

# /proc/cpuinfo flags of native bfloat16 arithmetic on x86
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (every core has the same)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def slow_bfloat16_hint(dtype: str, machine: str, cpuinfo: str | None) -> str | None:
    """A warning for a bfloat16 engine on an x86 CPU without native bfloat16, else None.

    `dtype`: the engine's resolved dtype (as vLLM's model config prints it, e.g. `torch.bfloat16`);
    `cpuinfo`: the text of /proc/cpuinfo, None where there is none (then nothing can be told).
    """
    if "bfloat16" not in dtype or cpuinfo is None or machine.lower() not in ("x86_64", "amd64"):
        return None
    if cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS:
        return None
    return (
        "this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 flag), so vLLM emulates the model's "
        "bfloat16 matmuls; set explorer.rollout_model.dtype=float32 to sample several times faster "
        "(2.5x for the tiny model, over 5x at 113M on an AVX2 machine; see docs/PERFORMANCE.md)"
    )


def host_hint(dtype: str) -> str | None:
    """`slow_bfloat16_hint` for this host."""
    info = Path("/proc/cpuinfo")
    return slow_bfloat16_hint(dtype, platform.machine(), info.read_text() if info.exists() else None)
