"""The bundled function-calling model `tiny-fc-llama` and the `tool_math_fc` workflow, on plain data: its
template renders an OpenAI-style history to the bytes the model samples, its calls are a few tokens, its
BUILD_INFO.json records the bands, and the workflow answers calls and takes an unreadable one as the
answer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
from transformers import PreTrainedTokenizerFast

from operators.workflows.tool_math_fc import (
    CALCULATOR_TOOL,
    CALL_PREFIX,
    CALL_SUFFIX,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolMathFCWorkflow,
    call_result,
    hermes_call,
)
from pipelines.reference import arith_tasks, tiny_model
from pipelines.reference.tiny_fc_model import FC_RECIPE, conversations
from pipelines.reference.tool_model_check import eval_tasks
from schemas.config import FC_MODEL, TOOL_MODEL

CALL = hermes_call("47 * 83")


def history(arguments: object, content: str | None = None) -> list[dict]:
    """A question, the model's call as an OpenAI client sends it back, and the tool's answer."""
    call = {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return [
        {"role": "user", "content": "What is 47 * 83?"},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": "3901"},
    ]


def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(FC_MODEL)


def test_shipped_fc_model_matches_its_build_info_and_its_bands() -> None:
    info = json.loads((FC_MODEL / "BUILD_INFO.json").read_text())
    assert tiny_model.weights_hash(FC_MODEL) == info["weights_hash"]
    assert info["seed"] == 0 and info["train_steps"] == FC_RECIPE.train_steps
    assert tiny_model.default_model_dir(FC_RECIPE) == FC_MODEL
    assert sum(p.stat().st_size for p in FC_MODEL.rglob("*") if p.is_file()) <= 5 * 1024 * 1024
    figures = info["vllm_fc_figures"]
    greedy, sampled = figures["greedy"], figures["temperature_1"]
    assert greedy["runs"] == 200  # every eval task, once
    assert greedy["call_rate"] >= 0.9 and greedy["parse_rate"] >= 0.95 and greedy["reward"] >= 0.5
    assert sampled["call_rate"] >= 0.6
    assert greedy["drift_splits"] == 0 == sampled["drift_splits"]


@pytest.mark.parametrize("arguments", [{"expression": "47 * 83"}, '{"expression": "47 * 83"}'])
@pytest.mark.parametrize("content", [None, ""])
def test_the_template_renders_an_openai_history_back_to_the_sampled_bytes(arguments, content) -> None:
    """vLLM hands the template the arguments as a dict; a JSON string (the OpenAI format) renders the same."""
    text = tokenizer().apply_chat_template(
        history(arguments, content), add_generation_prompt=True, tokenize=False
    )
    assert (
        text
        == f"<|bos|><|user|>What is 47 * 83?<|eos|><|assistant|>{CALL}<|eos|><|tool|>3901<|eos|><|assistant|>"
    )


def test_a_call_is_what_the_hermes_parser_re_serialises_and_a_few_tokens() -> None:
    body = CALL.removeprefix(TOOL_CALL_OPEN).removesuffix(TOOL_CALL_CLOSE)
    parsed = json.loads(body)
    assert list(parsed) == ["name", "arguments"]
    # the parser's output, as vLLM's hermes parser writes it (the arguments as a JSON string), rendered back
    arguments = json.dumps(parsed["arguments"], ensure_ascii=False)
    rendered = tokenizer().apply_chat_template(history(arguments), tokenize=False)
    assert f"<|assistant|>{CALL}<|eos|>" in rendered
    assert f"{TOOL_CALL_OPEN}{CALL_PREFIX}47 * 83{CALL_SUFFIX}{TOOL_CALL_CLOSE}" == CALL
    tok = tokenizer()
    for token in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, CALL_PREFIX, CALL_SUFFIX, "<|tool|>"):
        assert len(tok(token, add_special_tokens=False)["input_ids"]) == 1
    assert len(tok(CALL, add_special_tokens=False)["input_ids"]) == 10


def test_the_template_renders_no_tool_schema_and_refuses_unknown_roles() -> None:
    tok = tokenizer()
    messages = history({"expression": "47 * 83"})
    plain = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (
        tok.apply_chat_template(messages, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False)
        == plain
    )
    with pytest.raises(jinja2.TemplateError, match="unsupported role: developer"):
        tok.apply_chat_template([{"role": "developer", "content": "x"}], tokenize=False)


def test_the_tool_models_ids_are_kept_by_the_fc_tokenizer() -> None:
    tool = PreTrainedTokenizerFast.from_pretrained(TOOL_MODEL)
    vocab = tokenizer().get_vocab()
    assert {k: v for k, v in vocab.items() if k in tool.get_vocab()} == tool.get_vocab()


def test_the_fc_training_stream_is_deterministic_from_train_splits_and_in_the_template() -> None:
    stream = conversations(0, 600)
    assert stream == conversations(0, 600) and stream != conversations(1, 600)
    prompts = [turn.content for turns in stream for turn in turns if turn.role == "user"]
    assert all(arith_tasks.split_of(prompt) == "train" for prompt in prompts)
    calls = [turns for turns in stream if any(t.content.startswith(TOOL_CALL_OPEN) for t in turns)]
    drills = [turns for turns in calls if any(t.given for t in turns)]
    assert 0 < len(drills) < len(calls)
    assert any(turns[0].role == "system" for turns in calls) and any(
        turns[0].role == "user" for turns in calls
    )
    tok = tokenizer()
    for turns in calls[:20]:  # each trained conversation is exactly the template's rendering of it
        messages = [{"role": t.role, "content": t.content} for t in turns]
        expected = "<|bos|>" + "".join(f"<|{t.role}|>{t.content}<|eos|>" for t in turns)
        assert tok.apply_chat_template(messages, tokenize=False) == expected


@pytest.mark.timeout(120)
def test_short_fc_builds_from_the_tool_model_are_deterministic(tmp_path: Path) -> None:
    hashes = [
        tiny_model.weights_hash(tiny_model.build_tiny_model(tmp_path / str(i), 0, 2, FC_RECIPE))
        for i in range(2)
    ]
    assert hashes[0] == hashes[1]


# -- the workflow, on a stand-in client ----------------------------------------------------------------------


def test_call_results_answer_calls_and_say_what_to_fix() -> None:
    assert call_result("calculator", '{"expression": "47 * 83"}') == "3901"
    assert call_result("search", "{}").startswith("error: no tool named 'search'")
    assert call_result("calculator", "[1]").startswith("error: give the arguments")
    assert call_result("calculator", "{not json").startswith("error: give the arguments")
    assert call_result("calculator", '{"expression": "1/0"}') == "error: calculator: division by zero"


class StandInClient:
    """Answers chat requests from a script of replies (text, or a call's arguments) and keeps the requests."""

    def __init__(self, replies: list[str | dict]):
        self.replies = replies
        self.requests: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **request: object) -> SimpleNamespace:
        self.requests.append(json.loads(json.dumps(request)))
        reply = self.replies[len(self.requests) - 1]
        if isinstance(reply, str):
            message = SimpleNamespace(content=reply, tool_calls=None)
        else:
            function = SimpleNamespace(name="calculator", arguments=json.dumps(reply))
            calls = [SimpleNamespace(id=f"c{len(self.requests)}", function=function)]
            message = SimpleNamespace(content=None, tool_calls=calls)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def run(replies: list[str | dict]) -> tuple[dict, StandInClient]:
    [task] = eval_tasks("tool_math_fc", "t", [{"prompt": "What is 47 * 83?", "answer": "3901"}], 1, 0)
    client = StandInClient(replies)
    return asyncio.run(ToolMathFCWorkflow().run_agent(task, client, "m")), client


def test_the_workflow_sends_the_tool_answers_each_call_and_scores_the_answer() -> None:
    result, client = run([{"expression": "47 * 83"}, "<answer>3901</answer>"])
    assert result["reward"] == 1.0 and result["tool_calls"] == 1.0 and result["malformed_calls"] == 0.0
    assert result["called_tool"] == 1.0
    assert all(request["tools"] == [CALCULATOR_TOOL] for request in client.requests)
    second = client.requests[1]["messages"]
    assert second[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "47 * 83"}'},
            }
        ],
    }
    assert second[2] == {"role": "tool", "tool_call_id": "c1", "content": "3901"}


def test_a_call_the_parser_could_not_read_is_the_final_answer_not_an_error() -> None:
    result, client = run([f"{TOOL_CALL_OPEN}{{not json{TOOL_CALL_CLOSE}"])
    assert len(client.requests) == 1
    assert result["reward"] == 0.0 and result["tool_calls"] == 0.0 and result["malformed_calls"] == 1.0
    assert result["called_tool"] == 1.0
