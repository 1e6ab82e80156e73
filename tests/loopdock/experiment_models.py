"""Scripted stand-ins for the DeepSeek models of the shipped fix-files experiment.

Both know each task's answer (the file to write and what to write in it). ``pro`` works
with whatever tools it is given: on minimal-first it looks around first (list_dir), then
writes the file once the standard tools are back. ``flash`` writes at once when it can,
but given only the minimal toolset it gives up and says so. Each call reports a fixed
usage, so tokens and costs are exact.
"""

from __future__ import annotations

import json
from pathlib import Path

from loopdock.runtime.models import Reply, ScriptedAdapter, ToolCall, Usage

ROOT = Path(__file__).resolve().parents[2]
FIX_FILES = ROOT / "examples" / "experiments" / "fix-files"
USAGE = {"deepseek-v4-flash": Usage(1000, 50), "deepseek-v4-pro": Usage(2000, 100)}


def solutions() -> dict[str, tuple[str, str]]:
    """Each sample's input -> (file to write, its content)."""
    out = {}
    for line in (FIX_FILES / "tasks.jsonl").read_text().splitlines():
        sample = json.loads(line)
        out[sample["input"]] = (sample["metadata"]["check"], sample["target"] + "\n")
    return out


def deepseek_stand_in() -> ScriptedAdapter:
    answers = solutions()

    def respond(request):
        usage = USAGE[request.model]
        task = next(m.text for m in request.messages if m.role == "user")
        path, content = answers[task]
        tools = {t.name for t in request.tools}
        wrote = any(c.name == "write_file" for m in request.messages for c in m.tool_calls)
        if wrote:
            return Reply(text="done", usage=usage)
        if "write_file" in tools:
            return Reply(tool_calls=[ToolCall("write_file", {"path": path, "content": content})], usage=usage)
        if request.model == "deepseek-v4-flash":
            return Reply(text="I cannot change files with these tools.", usage=usage)
        return Reply(tool_calls=[ToolCall("list_dir", {"path": "."})], usage=usage)

    return ScriptedAdapter(respond)
