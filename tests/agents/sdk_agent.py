"""A real OpenAI Agents SDK client (openai-agents), run as its own process by the agent tests.

    python sdk_agent.py responses|chat BASE_URL API_KEY PROMPT [--temperature T] [--max-turns N]
        [--instructions-file F]

One agent with one function tool that runs a shell command. Prints the final output; on a
refusal prints the SDK's error class and message (what a user of the SDK sees) and exits 1.
"""

import argparse
import subprocess
import sys

from openai import AsyncOpenAI, APIStatusError
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)

parser = argparse.ArgumentParser()
parser.add_argument("api", choices=["responses", "chat"])
parser.add_argument("base_url")
parser.add_argument("api_key")
parser.add_argument("prompt")
parser.add_argument("--model", default="gpt-5.6-luna")
parser.add_argument("--temperature", type=float)
parser.add_argument("--max-turns", type=int, default=10)
parser.add_argument("--instructions-file", help="the agent's instructions (default: one line)")
args = parser.parse_args()


@function_tool
def run_command(command: str) -> str:
    """Run a shell command and return its output."""
    return subprocess.run(["bash", "-lc", command], capture_output=True, text=True).stdout


client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
Model = OpenAIResponsesModel if args.api == "responses" else OpenAIChatCompletionsModel
agent = Agent(
    name="worker",
    instructions=open(args.instructions_file).read() if args.instructions_file else "You run commands.",
    tools=[run_command],
    model=Model(model=args.model, openai_client=client),
    model_settings=ModelSettings(temperature=args.temperature),
)
try:
    result = Runner.run_sync(agent, args.prompt, max_turns=args.max_turns)
except APIStatusError as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(1)
print(result.final_output)
