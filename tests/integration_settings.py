"""Settings the integration tests share: small steps, two samples per task, four logical CPUs."""

BASE = [
    "buffer.batch_size=4",
    "buffer.explorer_input.taskset.repeat_times=2",
    "ray.num_cpus=4",
    "explorer.rollout_model.enable_openai_api=true",  # agent tests share the engine: it serves the API too
    # vLLM on CPU runs the float32 tiny model in bfloat16 under dtype auto, which an x86 CPU without native
    # bfloat16 emulates 2.5x slower; no test but the dtype ones is about the dtype
    "explorer.rollout_model.dtype=float32",
]
ENGINE_API_KEY = (
    "rftflow-test-key"  # the in-process engine serves its OpenAI API on every interface, so with a key
)
