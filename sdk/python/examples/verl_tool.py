"""A verl-style agent tool on Brig: verl's `BaseTool` lifecycle (create / execute /
calc_reward / release) with one sandbox per trajectory. The agent runs Python code; the reward
is whether the sandbox's `answer.txt` holds the right number.

    BRIG_STATE_DIR=... python verl_tool.py
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import brig


class CodeInterpreterTool:
    """What verl's tool interface asks for, on Brig sandboxes."""

    def __init__(self, client: brig.AsyncClient, image: str = "debian-12") -> None:
        self.client = client
        self.image = image
        self.sandboxes: dict[str, brig.AsyncSandbox] = {}

    async def create(self, instance_id: str | None = None) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self.sandboxes[instance_id] = await self.client.create(
            image=self.image, labels={"tool": "code", "trajectory": instance_id}, idle_ttl=600
        )
        return instance_id

    async def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, Any]]:
        sb = self.sandboxes[instance_id]
        result = await sb.exec(["python3", "-c", str(parameters["code"])], timeout=30, output_limit=64 << 10)
        response = result.stdout_text + result.stderr_text
        if result.timed_out:
            response += "\n[timed out]"
        return response, 0.0, {"exit_code": result.exit_code, "ms": result.duration_ms}

    async def calc_reward(self, instance_id: str) -> float:
        sb = self.sandboxes[instance_id]
        try:
            answer = await sb.read_file("/answer.txt")
        except brig.SandboxNotFound:
            return 0.0
        return 1.0 if answer.strip() == b"42" else 0.0

    async def release(self, instance_id: str) -> None:
        await self.sandboxes.pop(instance_id).destroy()


async def main() -> None:
    client = await brig.AsyncClient.connect_local()
    tool = CodeInterpreterTool(client)
    rewards = []
    for attempt in ("6 * 7", "6 * 8"):
        iid = await tool.create()
        response, _, metrics = await tool.execute(iid, {"code": f"v = {attempt}\nprint(v)\nopen('/answer.txt', 'w').write(str(v))"})
        rewards.append(await tool.calc_reward(iid))
        print(f"{attempt}: printed {response.strip()!r}, exit {metrics['exit_code']}, reward {rewards[-1]}")
        await tool.release(iid)
    assert rewards == [1.0, 0.0], rewards


if __name__ == "__main__":
    asyncio.run(main())
