"""Moving tensors between a trainer and engine workers, bit for bit: wire form, buckets, broadcast group.

Both sides import this: the trainer (rank 0) packs and broadcasts, the engine workers receive and unpack.
The engine actor's module imports it too, and the driver imports that one (to start engines) without torch,
so torch, safetensors.torch, Ray and vLLM are imported by the functions that use them.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from operators.actors.names import get_within

if TYPE_CHECKING:
    import torch

# (name, shape, dtype name): what the trainer announces and what a receiver allocates
TensorMeta = tuple[str, list[int], str]
# (name, shape, dtype name, raw bytes): a tensor as vLLM's utility RPC carries it (it rebuilds no tensors)
WireTensor = tuple[str, list[int], str, bytes]

BUCKET_BYTES = 256 * 2**20
STATE_FETCH_S = 600.0  # a state dict of a large model crossing nodes; past this the object is lost, not slow


def dtype_of(name: str) -> torch.dtype:
    import torch  # heavy, deferred: see the module docstring

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype '{name}'")
    return dtype


def buckets(meta: list[TensorMeta], limit: int = BUCKET_BYTES) -> list[list[TensorMeta]]:
    """Consecutive tensors in groups of about `limit` bytes: a sync is a few transfers, not one per tensor."""
    groups: list[list[TensorMeta]] = [[]]
    size = 0
    for entry in meta:
        nbytes = nbytes_of(entry)
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += nbytes
    return [g for g in groups if g]


def nbytes_of(entry: TensorMeta) -> int:
    import torch  # heavy, deferred: see the module docstring

    _, shape, dtype = entry
    return int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype_of(dtype)).element_size()


def pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Tensors as one flat byte buffer (bit-exact, whatever their dtypes)."""
    import torch  # heavy, deferred: see the module docstring

    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def to_wire(name: str, tensor: torch.Tensor) -> WireTensor:
    import torch  # heavy, deferred: see the module docstring

    tensor = tensor.detach().cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    return (name, list(tensor.shape), dtype, tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


def from_wire(wire: WireTensor) -> tuple[str, torch.Tensor]:
    import torch  # heavy, deferred: see the module docstring

    name, shape, dtype, data = wire
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return name, flat.view(dtype_of(dtype)).reshape(shape)


def unpack(buffer: torch.Tensor, group: list[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
    out, offset = [], 0
    for entry in group:
        name, shape, dtype = entry
        nbytes = nbytes_of(entry)
        # cloned before the view: a slice may start off its dtype's alignment (bf16 then f32, say)
        out.append((name, buffer[offset : offset + nbytes].clone().view(dtype_of(dtype)).reshape(shape)))
        offset += nbytes
    return out


def stage_state_dict(state: dict[str, torch.Tensor] | list[Any]) -> Path:
    """Write a state dict (or the one `[ref]` points to in the Ray object store) as a safetensors file.

    It goes to shared memory when that has room (the engine worker on this node then maps it), else to the
    temp dir. The caller removes the file's directory.
    """
    from safetensors.torch import save_file  # heavy (imports torch), deferred: as torch

    if isinstance(state, list):
        state = get_within(state[0], "the state dict from Ray's object store", STATE_FETCH_S)
    tensors = {name: t.detach().contiguous().cpu() for name, t in state.items()}
    needed = sum(t.numel() * t.element_size() for t in tensors.values())
    shm = Path("/dev/shm")
    room = shm.is_dir() and shutil.disk_usage(shm).free > 2 * needed
    directory = Path(tempfile.mkdtemp(prefix="rftflow-weights-", dir=shm if room else None))
    path = directory / "model.safetensors"
    save_file(tensors, str(path))
    return path


def open_group(address: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float):
    """A torch.distributed group that leaves vLLM's own default group alone."""
    from vllm.distributed.utils import (  # heavy, deferred: only a broadcast group needs vLLM
        stateless_init_torch_distributed_process_group,
    )

    return stateless_init_torch_distributed_process_group(
        address, port, rank, world_size, backend, timeout=timedelta(seconds=timeout_s)
    )


def broadcast_bucket(group: Any, buffer: torch.Tensor) -> None:
    """Rank 0's bytes to every rank; stateless groups cannot use `dist.broadcast`, so call the group."""
    group.broadcast(buffer, 0).wait()


def send(group: Any, state_dict: dict[str, torch.Tensor], limit: int = BUCKET_BYTES) -> int:
    """Rank 0's side of a weight broadcast: the same buckets, in the same order, as `meta_of` announces."""
    total = 0
    for bucket in buckets(meta_of(state_dict), limit):
        buffer = pack([state_dict[name] for name, _, _ in bucket])
        broadcast_bucket(group, buffer)
        total += buffer.numel()
    return total


def meta_of(state_dict: dict[str, torch.Tensor]) -> list[TensorMeta]:
    return [(name, list(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state_dict.items()]
