"""A GRPO group on Brig: one task sandbox is prepared once, forked 16 ways (one child per
sampled answer), and each child is graded on a `fork_for_evaluation` copy that can see the
hidden reference answer the agent never could.

    BRIG_STATE_DIR=... python grpo_group.py [GROUP]
"""

from __future__ import annotations

import asyncio
import sys

import brig


async def grade(child: brig.AsyncSandbox) -> float:
    judge = await child.fork_for_evaluation()
    try:
        r = await judge.exec("cmp -s /work/answer /etc/debian_version && echo pass")
        return 1.0 if r.stdout_text.strip() == "pass" else 0.0
    finally:
        await judge.destroy()


async def main(group: int) -> None:
    client = await brig.AsyncClient.connect_local()
    # The reference answer (here: the image's /etc/debian_version) is hidden from the agent.
    task = await client.create(image="debian-12", hidden_paths=["/etc/debian_version"], labels={"grpo": "demo"})
    try:
        await task.exec("mkdir -p /work && echo 'the task, set up once' > /work/README")
        children = await task.fork(group, labels={"grpo": "demo"})
        # Half the samples copy the right answer (known to this script, not to the agent).
        reference = await client.create(image="debian-12", labels={"grpo": "demo"})
        right = (await reference.exec("cat /etc/debian_version")).stdout
        await asyncio.gather(
            *[c.write_file("/work/answer", right if i % 2 == 0 else b"wrong\n") for i, c in enumerate(children)]
        )
        seen = await children[0].exec("cat /etc/debian_version")
        assert seen.stdout == b"", "the agent cannot read the reference"
        rewards = await asyncio.gather(*[grade(c) for c in children])
        print(f"group of {group}: rewards {rewards}")
        assert rewards == [1.0 if i % 2 == 0 else 0.0 for i in range(group)]
    finally:
        await client.destroy({"grpo": "demo"})


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 16))
