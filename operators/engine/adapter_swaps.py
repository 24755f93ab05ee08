"""`AdapterSwaps`: how an engine takes a new LoRA adapter version in place (a mixin of `VLLMEngine`).

Each version is added under its own name and id (`<name>-v<N>`, id N + 1) from its own folder, never over an
older one: vLLM's prefix cache is keyed by the adapter, so a rewritten folder would serve stale prefixes. The
load runs inside the same pause as a full-weight load (`WeightSwaps._swap`), and within it the delivery probe
is scored under the new adapter and under the base model: only when the scores prove the adapter arrived
(`operators.engine.adapters.check_delivery`) does it become the one every request samples with. The base
model's scores are kept between loads (a LoRA run never changes the base weights; any full-weight load drops
them), so each load pays one probe pass, not two: the check is most of an adapter sync's cost. Otherwise it
is removed again and the engine stays on its old version. Versions beyond the newest `keep` are unloaded
after the new one is in.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from operators.engine.adapters import WEIGHTS_FILE, Probe, check_delivery, lora_id, lora_version


def stage_adapter(state: dict[str, Any] | list[Any], config: dict[str, Any], name: str) -> Path:
    """Write an adapter handed over in memory as a PEFT folder of its own, named for its version."""
    from operators.engine.transfer import stage_state_dict  # heavy (torch), deferred: engine process only

    staged = stage_state_dict(state)
    folder = staged.parent / name
    folder.mkdir()
    staged.rename(folder / WEIGHTS_FILE)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


class AdapterSwaps:
    """The adapter loads of `VLLMEngine`, which provides `llm`, `_swap`, `model_version` and `server` (its
    OpenAI endpoint or None); `adapter` is the `LoRARequest` every request samples with (None: the base
    model). Each loaded version is also listed in the endpoint's model registry under its own name."""

    adapter: Any = None
    server: Any = None
    # (version, its LoRARequest, staged folder to remove when unloaded or None) of each loaded version,
    # oldest first
    adapters_loaded: list[tuple[int, Any, Path | None]]
    # the base model's probe scores by probe sequence, until the base weights change (`WeightSwaps._swap`)
    base_scores: dict[tuple[int, ...], list[float]]

    async def probe_logprobs(self, ids: list[int], lora: Any) -> list[float]:
        """Prompt logprobs of `ids` (each token after the first) under `lora` (None: the base model)."""
        from vllm import SamplingParams  # heavy, deferred: only the engine process imports vLLM

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        final = None
        rid = f"probe-{uuid.uuid4().hex}"
        async for output in self.llm.generate({"prompt_token_ids": ids}, params, rid, lora_request=lora):
            final = output
        scores = final.prompt_logprobs[1:] if final is not None and final.prompt_logprobs else []
        return [float(step[tok].logprob) for step, tok in zip(scores, ids[1:], strict=True)]

    async def load_adapter(
        self,
        path: str,
        version: int,
        name: str,
        probe: dict[str, list],
        keep: int,
        timeout: float | None = None,
        preempt: bool = False,
        staged: bool = False,
    ) -> dict[str, float]:
        """Add adapter `path` as `<name>-v<version>`, prove it with `probe`, make it current, unload the
        versions beyond the newest `keep`. `staged`: the folder is this engine's own (memory), removed when
        the version is unloaded or refused."""
        from vllm.lora.request import LoRARequest  # heavy, deferred: only the engine process imports vLLM

        expected = Probe(**probe)
        lora = LoRARequest(f"{name}-v{version}", lora_id(version), str(path))
        folder = Path(path) if staged else None
        report: dict[str, float] = {}

        async def load() -> int:
            started = time.perf_counter()
            # a retried version: added afresh, as sent now
            if lora.lora_int_id in await self.llm.list_loras():
                await self.llm.remove_lora(lora.lora_int_id)
            if not await self.llm.add_lora(lora):
                raise RuntimeError(f"vLLM refused adapter {lora.lora_name} from {path}")
            added = time.perf_counter()
            try:
                got = await self.probe_logprobs(expected.token_ids, lora)
                report.update(check_delivery(lora.lora_name, expected, got, await self.base_probe(expected)))
            except Exception:  # a refused or failed probe: the old version stays current
                await self.llm.remove_lora(lora.lora_int_id)
                raise
            report.update(add_s=added - started, probe_s=time.perf_counter() - added)
            self.adapter = lora
            return sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))

        try:
            result = await self._swap(version, load, preempt, base=False)
        except BaseException:
            if folder is not None:
                shutil.rmtree(folder.parent, ignore_errors=True)
            raise
        earlier = [e for e in self.adapters_loaded if e[0] == version]  # a version loaded again (a roll-back)
        folder = folder or (earlier[0][2] if earlier else None)
        kept = [e for e in self.adapters_loaded if e[0] != version]
        self.adapters_loaded = [*kept, (version, lora, folder)]
        if self.server is not None:
            self.server.list_adapter(lora)
        await self.unload_beyond(keep)
        return {**result, **report}

    async def base_probe(self, probe: Probe) -> list[float]:
        """The base model's scores of the probe's sequence: computed on first use, then kept."""
        key = tuple(probe.token_ids)
        if key not in self.base_scores:
            self.base_scores[key] = await self.probe_logprobs(probe.token_ids, None)
        return self.base_scores[key]

    async def load_adapter_state(
        self,
        state: list[Any],
        config: dict[str, Any],
        version: int,
        name: str,
        probe: dict[str, list],
        keep: int,
        timeout: float | None = None,
        preempt: bool = False,
    ) -> dict[str, float]:
        """An adapter handed over in memory (`[ref]` to its tensors), staged before the pause as a folder of
        its own, then loaded as a checkpoint's is."""
        folder = await asyncio.to_thread(stage_adapter, state, config, f"{name}-v{version}")
        return await self.load_adapter(str(folder), version, name, probe, keep, timeout, preempt, staged=True)

    async def unload_beyond(self, keep: int) -> list[int]:
        """Unload all but the newest `keep` versions (the current one always stays); their versions."""
        old, self.adapters_loaded = self.adapters_loaded[:-keep], self.adapters_loaded[-keep:]
        for _, lora, folder in old:
            if self.server is not None:
                self.server.unlist_adapter(lora.lora_name)
            await self.llm.remove_lora(lora.lora_int_id)
            if folder is not None:
                shutil.rmtree(folder.parent, ignore_errors=True)
        return [v for v, _, _ in old]

    async def loaded_adapters(self) -> list[int]:
        """The versions vLLM holds, oldest first (for tests and the fleet's checks)."""
        ids = await self.llm.list_loras()
        return sorted(lora_version(i) for i in ids)

    def current_adapter(self) -> str | None:
        """The name of the adapter requests sample with (None: the base model)."""
        return None if self.adapter is None else self.adapter.lora_name
