"""Moving tensors bit for bit: buckets, the packed byte buffer, and the wire form vLLM's RPC carries."""

from __future__ import annotations

import random

import pytest
import torch

from operators.engine.transfer import (
    TensorMeta,
    buckets,
    dtype_of,
    from_wire,
    meta_of,
    nbytes_of,
    pack,
    to_wire,
    unpack,
)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bytes, so -0.0 and NaN payloads compare exactly."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bit_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert torch.equal(bits(got), bits(want))


def awkward_tensors() -> dict[str, torch.Tensor]:
    """Mixed dtypes holding values a float comparison would get wrong: -0.0, NaNs with payloads, extremes."""
    f32 = torch.tensor([0.0, -0.0, 1.5, float("inf"), float("-inf"), 0.0], dtype=torch.float32)
    f32.view(torch.int32)[5] = 0x7FC12345  # quiet NaN with a payload
    bf16 = torch.tensor([[-0.0, 3.0], [0.0, 0.0]], dtype=torch.bfloat16)
    bf16.view(torch.int16)[1, 1] = 0x7FC1  # NaN with a payload
    bf16.view(torch.int16)[1, 0] = -0x0041  # 0xFFBF: negative NaN with a payload
    i64 = torch.tensor([[-(2**63), 2**63 - 1, 0]], dtype=torch.int64)
    return {"ids": i64, "weights": f32.reshape(2, 3), "norm": bf16}


# -- buckets -----------------------------------------------------------------------------------------------


def f32(name: str, numel: int) -> TensorMeta:
    return (name, [numel], "float32")


def test_buckets_group_consecutive_tensors_up_to_the_limit() -> None:
    meta = [f32("a", 10), f32("b", 15), f32("c", 10), f32("d", 10)]  # 40, 60, 40, 40 bytes

    assert buckets(meta, limit=100) == [[meta[0], meta[1]], [meta[2], meta[3]]]  # exactly 100 still fits


def test_a_tensor_larger_than_the_limit_travels_alone() -> None:
    meta = [f32("a", 10), f32("big", 100), f32("c", 10)]

    assert buckets(meta, limit=100) == [[meta[0]], [meta[1]], [meta[2]]]
    assert buckets(meta[1:], limit=100) == [[meta[1]], [meta[2]]]


def test_buckets_of_nothing_is_no_bucket() -> None:
    assert buckets([], limit=100) == []


def test_buckets_keep_order_and_never_hold_nothing() -> None:
    rng = random.Random(7)
    dtypes = ["float32", "bfloat16", "int64", "uint8"]
    meta = [(f"t{i}", [rng.randrange(0, 60)], rng.choice(dtypes)) for i in range(200)]

    groups = buckets(meta, limit=128)

    assert [entry for group in groups for entry in group] == meta
    assert all(groups)
    for previous, group in zip(groups, groups[1:], strict=False):
        # a new bucket starts only when the next tensor would not fit in the previous one
        assert sum(map(nbytes_of, previous)) + nbytes_of(group[0]) > 128
    for group in groups:
        assert len(group) == 1 or sum(map(nbytes_of, group)) <= 128


@pytest.mark.parametrize(
    "entry,nbytes",
    [
        (("w", [3, 4], "bfloat16"), 24),
        (("w", [2], "int64"), 16),
        (("w", [], "float32"), 4),
        (("w", [0, 7], "float32"), 0),
        (("w", [5], "bool"), 5),
    ],
)
def test_nbytes_of(entry: TensorMeta, nbytes: int) -> None:
    assert nbytes_of(entry) == nbytes


# -- pack / unpack -----------------------------------------------------------------------------------------


def test_pack_unpack_round_trips_bit_exactly() -> None:
    tensors = awkward_tensors()
    meta = meta_of(tensors)

    buffer = pack(list(tensors.values()))
    received = unpack(buffer, meta)

    assert buffer.dtype == torch.uint8 and buffer.numel() == sum(map(nbytes_of, meta))
    assert [name for name, _ in received] == list(tensors)
    for name, got in received:
        assert_bit_equal(got, tensors[name])


def test_unpacked_tensors_do_not_share_the_buffer() -> None:
    tensors = awkward_tensors()
    buffer = pack(list(tensors.values()))
    received = dict(unpack(buffer, meta_of(tensors)))

    buffer.fill_(0xAB)

    for name, got in received.items():
        assert_bit_equal(got, tensors[name])


def test_pack_takes_non_contiguous_tensors() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert not t.is_contiguous()

    [(_, got)] = unpack(pack([t]), [("t", list(t.shape), "float32")])

    assert torch.equal(got, t)


def test_pack_unpack_round_trips_whatever_the_order_of_dtypes() -> None:
    tensors = {"odd": torch.ones(3, dtype=torch.bfloat16), "wide": torch.ones(2, dtype=torch.float32)}

    received = dict(unpack(pack(list(tensors.values())), meta_of(tensors)))

    for name, t in tensors.items():
        assert_bit_equal(received[name], t)


# -- wire form ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tensor",
    [
        *awkward_tensors().values(),
        torch.empty(0, 3, dtype=torch.float32),
        torch.empty(0, dtype=torch.bfloat16),
        torch.tensor(2.5, dtype=torch.float32),
        torch.tensor([True, False, True]),
        torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t(),
    ],
    ids=["int64", "float32", "bfloat16", "empty-2d", "empty-bf16", "scalar", "bool", "bf16-transposed"],
)
def test_wire_form_round_trips_bit_exactly(tensor: torch.Tensor) -> None:
    wire = to_wire("layer.weight", tensor)
    name, shape, dtype, data = wire

    assert (name, shape, dtype) == (
        "layer.weight",
        list(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
    )
    assert isinstance(data, bytes) and len(data) == tensor.numel() * tensor.element_size()
    got_name, got = from_wire(wire)
    assert got_name == "layer.weight"
    assert_bit_equal(got, tensor)


def test_wire_tensor_is_a_writable_copy() -> None:
    _, got = from_wire(to_wire("w", torch.zeros(4)))

    got += 1  # would fail or warn on a read-only buffer

    assert torch.equal(got, torch.ones(4))


def test_meta_of_lists_names_shapes_and_dtype_names_in_order() -> None:
    state = {
        "b": torch.zeros(2, 3, dtype=torch.bfloat16),
        "a": torch.zeros(4, dtype=torch.int64),
        "s": torch.tensor(1.0),
    }

    assert meta_of(state) == [("b", [2, 3], "bfloat16"), ("a", [4], "int64"), ("s", [], "float32")]


@pytest.mark.parametrize(
    "name,dtype",
    [
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("torch.int64", torch.int64),
        ("bool", torch.bool),
    ],
)
def test_dtype_of_known_names(name: str, dtype: torch.dtype) -> None:
    assert dtype_of(name) is dtype


@pytest.mark.parametrize("name", ["float33", "", "Tensor", "Size", "torch.nn", "F32"])
def test_dtype_of_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match="unknown tensor dtype"):
        dtype_of(name)
