"""A vLLM worker extension: in-place weight loads and reads, run inside the engine's worker process.

vLLM mixes this class into its worker (`worker_extension_cls`), and the engine actor reaches these methods by
`collective_rpc`. They exist because a plain `model.load_weights` after start fails on CPU (linear weights are
repacked into kernel format) and because the broadcast group must live in the process that owns the model.

Every load goes through vLLM's in-place `reload_weights` and then `repack_tied`: on CPU, vLLM keeps a packed
copy of the LM head for its GEMM kernel, and when the head is tied to the input embeddings (most small models:
Qwen2.5 up to 3B, Llama 3.2, the bundled tiny ones) the reload fills the shared tensor through the embeddings
but never repacks the head ("ParallelLMHead: Failed to load weights"), so the engine would go on scoring with
the old head while embedding with the new one: a policy that is neither version.
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load_file

from operators.engine.transfer import (
    BUCKET_BYTES,
    TensorMeta,
    WireTensor,
    broadcast_bucket,
    buckets,
    nbytes_of,
    open_group,
    to_wire,
    unpack,
)


class WeightWorker:
    """Methods vLLM adds to its worker class; `self.model_runner` is the worker's."""

    def rftflow_reload(self, path: str) -> None:
        """Reload every weight in place from a Hugging Face checkpoint directory."""
        self._reload(weights_path=path)

    def rftflow_load_file(self, path: str) -> int:
        """Load a staged safetensors file in place; returns its tensor bytes."""
        tensors = load_file(path)
        self._load(list(tensors.items()))
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self._reload(weights_iterator=iter(weights))

    def _reload(self, **source: Any) -> None:
        """Every load's one way in: vLLM's in-place reload from `source` (a path or tensors), then the repack
        it leaves undone."""
        self.model_runner.reload_weights(**source)
        repack_tied(self.model_runner.get_model())

    def rftflow_get(self, name: str) -> WireTensor:
        return to_wire(name, read_param(self.model_runner.get_model(), name))

    def rftflow_open_group(
        self, address: str, port: int, rank_offset: int, world_size: int, backend: str, timeout_s: float
    ) -> int:
        from vllm.distributed import get_world_group  # heavy, deferred: read_param imports without vLLM

        rank = rank_offset + get_world_group().rank_in_group
        self.rftflow_group = open_group(address, port, rank, world_size, backend, timeout_s)
        return rank

    def rftflow_receive(self, meta: list[TensorMeta], bucket_bytes: int = BUCKET_BYTES) -> int:
        """Receive every bucket the trainer broadcasts, then load them in place; returns bytes received."""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        received: list[tuple[str, torch.Tensor]] = []
        total = 0
        for group in buckets([tuple(m) for m in meta], bucket_bytes):
            size = sum(nbytes_of(e) for e in group)
            buffer = torch.empty(size, dtype=torch.uint8, device=device)
            broadcast_bucket(self.rftflow_group, buffer)
            received.extend(unpack(buffer, group))
            total += size
        self._load(received)
        return total


def repack_tied(model: torch.nn.Module) -> None:
    """Rebuild the CPU kernel copy of every layer whose weight another layer shares (a tied LM head) from the
    shared tensor as it is now. Only CPU layers keep such a copy (`cpu_linear`), so on a GPU this does
    nothing; on CPU it costs 0.07-0.13 s for a 128k-152k vocabulary head."""
    holders: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name.endswith(".weight"):
            holders.setdefault(id(param), []).append(name.removesuffix(".weight"))
    for names in holders.values():
        for layer in (model.get_submodule(name) for name in names) if len(names) > 1 else ():
            method = getattr(layer, "quant_method", None)
            if hasattr(layer, "cpu_linear") and method is not None and layer.weight.numel() > 0:
                method.process_weights_after_loading(layer)


def read_param(model: torch.nn.Module, name: str) -> torch.Tensor:
    """A parameter's current value as the checkpoint holds it (single-GPU/CPU engines).

    Two engine layouts differ from the checkpoint: the CPU backend may replace a linear layer's weight with an
    empty tensor and keep only a packed copy in its GEMM kernel (multiplying the identity through that kernel
    returns the weight bit for bit), and vocabulary embeddings are padded with extra rows.
    """
    params = dict(model.named_parameters())
    if name not in params:
        raise KeyError(f"no parameter '{name}' in the engine's model; it has e.g. {sorted(params)[:4]}")
    param = params[name]
    layer = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    if param.numel() == 0 and hasattr(layer, "cpu_linear"):
        eye = torch.eye(layer.input_size_per_partition, dtype=param.dtype)
        return layer.cpu_linear(eye, None, None).t().contiguous()  # I @ W^T, transposed
    value = param.detach()
    if hasattr(layer, "org_vocab_size") and name.endswith(".weight"):
        value = value[: layer.org_vocab_size]
    return value.cpu().clone()
