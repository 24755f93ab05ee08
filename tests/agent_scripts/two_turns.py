"""An agent as its own process, for tests/engine/test_sessions.py: it knows only what its environment says
(`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`), reads its task from stdin, makes two chat calls with
the synchronous `openai` client, and prints its reward as JSON on its last line. `--sleep` makes it hang
after its first call (with a child process of its own), for the timeout test."""

import json
import os
import subprocess
import sys
import time

import openai

task = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)  # the base URL and key come from the environment
model = os.environ["OPENAI_MODEL"]
messages = [{"role": "user", "content": task["prompt"]}]
for _ in range(2):
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
    messages += [{"role": "user", "content": "ok, go on"}]
    if "--sleep" in sys.argv:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(json.dumps({"child": child.pid}), flush=True)
        time.sleep(600)
print("thinking done")
print(json.dumps({"reward": 1.0, "turns": 2.0}))
