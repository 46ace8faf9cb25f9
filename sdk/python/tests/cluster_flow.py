"""The Python SDK against a control-plane replica (run by tests/tests/python_sdk.rs, not by
pytest): project quotas refuse with QuotaExceeded, and a sandbox on a node the test kills
fails with SandboxLost. The test kills the node when this script names the sandbox in
$BRIG_SIGNAL_DIR/lost-id, and says so with $BRIG_SIGNAL_DIR/killed."""

import asyncio
import os
import pathlib
import time

import brig


async def main() -> None:
    addr, cert = os.environ["BRIG_ADDR"], os.environ["BRIG_CERT"]
    signals = pathlib.Path(os.environ["BRIG_SIGNAL_DIR"])
    admin = await brig.AsyncClient.connect(addr, cert, os.environ["BRIG_ADMIN_TOKEN"])
    assert admin.is_cluster
    nodes = await admin.cluster_status()
    assert len(nodes) == 2, nodes

    await admin.set_project("py-team", max_live=2)
    team = await brig.AsyncClient.connect(addr, cert, await admin.create_token("py-team"))
    first = [await team.create(tier="fncall") for _ in range(2)]
    try:
        await team.create(tier="fncall")
        raise AssertionError("a third sandbox passed a quota of two")
    except brig.QuotaExceeded as e:
        assert e.code == "quota_exceeded" and isinstance(e, brig.BrigError), e
    assert {s.id for s in await team.list()} == {sb.id for sb in first}
    assert any(p.name == "py-team" for p in await admin.projects())

    # A sandbox on node 1, which the test then kills.
    made = []
    while not any(sb.id.startswith("sb-00000001-") for sb in made):
        made.append(await admin.create(tier="fncall"))
        assert len(made) < 60, "nothing landed on node 1"
    lost = next(sb for sb in made if sb.id.startswith("sb-00000001-"))
    (signals / "lost-id").write_text(lost.id)
    deadline = time.monotonic() + 60
    while not (signals / "killed").exists():
        assert time.monotonic() < deadline, "the node was never killed"
        await asyncio.sleep(0.1)
    deadline = time.monotonic() + 20
    while True:
        try:
            await lost.status()
        except brig.SandboxLost as e:
            assert e.code == "sandbox_lost" and not e.retryable, e
            break
        except brig.BrigError:
            pass
        assert time.monotonic() < deadline, "node 1 was never marked down"
        await asyncio.sleep(0.2)
    print("cluster flow ok")


asyncio.run(main())
