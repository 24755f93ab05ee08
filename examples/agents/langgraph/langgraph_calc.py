"""`langgraph_calc`: the `tool_math` task as a LangGraph agent on `langchain-openai`'s `ChatOpenAI`.

The worked example of an agent that builds its own HTTP client (docs/workflows.md): it takes only the run's
`endpoint` (URL, key and model name) and never sees rftflow's client. The graph is LangGraph's tool loop:
the model node (`ChatOpenAI` with the calculator bound as a tool, over Chat Completions), a `ToolNode` that
runs the calls, and `tools_condition` routing back to the model until a reply makes no call. The engine
records every call made with the run's key, and rftflow builds the experiences from the engine's own token
ids (the tool results masked out).

Needs the `agents` extra (`pip install -e .[agents]`), `explorer.rollout_model.enable_openai_api` and
`tool_call_parser: hermes` on a model that calls tools Hermes-style (the bundled `tiny-fc-llama`):
pipelines/langgraph_calc.yaml. LangSmith tracing is off for the run, and the client does not retry.
"""

from __future__ import annotations

import asyncio
import json

import langsmith
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from operators.workflows import AgentWorkflow, call_result, call_reward, get_reward_fn, register_workflow

GRAPH_STEPS = 64  # LangGraph's recursion limit, above any run's turns: the engine holds the run's own limit


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: for example 47 * 83
    """
    return call_result("calculator", json.dumps({"expression": expression}))


def build_graph(llm: ChatOpenAI):
    """Model, then tools while the model calls any, then the model again."""
    model = llm.bind_tools([calculator])

    async def call_model(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)  # to "tools", or to the end
    graph.add_edge("tools", "model")
    return graph.compile()


@register_workflow("langgraph_calc")
class LangGraphCalc(AgentWorkflow):
    """The calculator agent as a LangGraph graph, on its own client built from the endpoint."""

    async def run_agent(self, task, client, model, endpoint) -> dict[str, float]:
        args = task.rollout_args
        llm = ChatOpenAI(
            model=endpoint.model,
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            max_retries=0,
            temperature=args["temperature"],
            top_p=args["top_p"],
            max_completion_tokens=args["max_tokens"],
        )
        with langsmith.tracing_context(enabled=False):
            state = await build_graph(llm).ainvoke(
                {"messages": [("user", task.prompt)]}, {"recursion_limit": GRAPH_STEPS}
            )
        messages = state["messages"]
        text = messages[-1].text
        reward_fn = get_reward_fn(task.reward_fn or "math_accuracy")
        scored = await asyncio.to_thread(call_reward, reward_fn, text, task)  # may run math-verify
        calls = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
        return {**scored, "tool_calls": float(calls), "called_tool": float(calls > 0)}
