"""The bfloat16 hint of CPU engines, on /proc/cpuinfo texts of two kinds of x86 CPU (no engine needed)."""

from __future__ import annotations

from operators.engine.cpu_dtype import cpu_flags, slow_bfloat16_hint

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme sse sse2 avx avx2 fma f16c
"""
WITH_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""


def test_flags_are_read_from_the_first_processor():
    assert cpu_flags(AVX2_ONLY) == {"fpu", "vme", "sse", "sse2", "avx", "avx2", "fma", "f16c"}
    assert cpu_flags("processor\t: 0\n") == set()


def test_bfloat16_without_native_support_gets_the_float32_hint():
    hint = slow_bfloat16_hint("torch.bfloat16", "x86_64", AVX2_ONLY)
    assert hint is not None and "explorer.rollout_model.dtype=float32" in hint


def test_no_hint_where_bfloat16_is_native_or_not_in_use_or_unknown():
    assert slow_bfloat16_hint("torch.bfloat16", "x86_64", WITH_AMX) is None
    assert slow_bfloat16_hint("torch.float32", "x86_64", AVX2_ONLY) is None
    assert slow_bfloat16_hint("torch.bfloat16", "aarch64", AVX2_ONLY) is None
    assert slow_bfloat16_hint("torch.bfloat16", "x86_64", None) is None
