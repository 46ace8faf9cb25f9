"""E2B volumes, as E2B's docs use them: made with `AsyncVolume.create`, written and read with no
sandbox, mounted by name into sandboxes at create (`volume_mounts`), seen by two sandboxes at
once, kept after the sandboxes go, and destroyed."""

import uuid

import pytest
from e2b import AsyncSandbox, AsyncVolume
from e2b.exceptions import NotFoundException


async def test_a_volume_is_written_without_a_sandbox_and_shared_by_two():
    name = f"vol-test-{uuid.uuid4().hex[:8]}"
    vol = await AsyncVolume.create(name)
    try:
        assert vol.name == name and vol.volume_id and vol.token
        listed = await AsyncVolume.list()
        assert any(v.volume_id == vol.volume_id and v.name == name for v in listed)
        info = await AsyncVolume.get_info(vol.volume_id)
        assert info.name == name

        # Files with no sandbox.
        made = await vol.make_dir("/data/in", force=True)
        assert made.type.value == "directory" and made.path == "/data/in"
        entry = await vol.write_file("/data/in/seed.txt", "seeded\n", mode=0o640, uid=1000, gid=1000)
        assert entry.size == 7 and entry.mode == 0o640 and entry.uid == 1000 and entry.name == "seed.txt"
        assert await vol.read_file("/data/in/seed.txt") == "seeded\n"
        assert await vol.read_file("/data/in/seed.txt", format="bytes") == b"seeded\n"
        chunks = [c async for c in await vol.read_file("/data/in/seed.txt", format="stream")]
        assert b"".join(chunks) == b"seeded\n"
        assert await vol.exists("/data/in/seed.txt")
        assert not await vol.exists("/data/nope")
        names = [e.path for e in await vol.list("/data", depth=2)]
        assert names == ["/data/in", "/data/in/seed.txt"], names
        changed = await vol.update_metadata("/data/in/seed.txt", mode=0o600)
        assert changed.mode == 0o600
        with pytest.raises(NotFoundException):
            await vol.read_file("/data/missing.txt")
        with pytest.raises(NotFoundException):
            await vol.write_file("/no/parent/file.txt", "x")
        # As E2B's volume service: an existing file is overwritten only with force; force
        # also makes the parents.
        with pytest.raises(Exception) as exists:
            await vol.write_file("/data/in/seed.txt", "again\n")
        assert "409" in str(exists.value)
        await vol.write_file("/data/in/seed.txt", "seeded\n", force=True, uid=1000, gid=1000)
        assert (await vol.write_file("/made/by/force.txt", "f", force=True)).size == 1

        # Mounted by name into two sandboxes at once.
        a = await AsyncSandbox.create(timeout=300, volume_mounts={"/mnt/shared": vol})
        b = await AsyncSandbox.create(timeout=300, volume_mounts={"/mnt/shared": name})
        try:
            seen = await a.commands.run("cat /mnt/shared/data/in/seed.txt; stat -c %u /mnt/shared/data/in/seed.txt")
            assert seen.stdout == "seeded\n1000\n"
            await a.commands.run("echo from-a > /mnt/shared/a.txt")
            assert (await b.commands.run("cat /mnt/shared/a.txt")).stdout == "from-a\n"
            assert await vol.read_file("/a.txt") == "from-a\n"
            detail = await a.get_info()
            assert detail.volume_mounts == [{"name": name, "path": "/mnt/shared"}]
        finally:
            await a.kill()
            await b.kill()

        # The files outlive the sandboxes.
        assert await vol.read_file("/a.txt") == "from-a\n"
        await vol.remove("/a.txt")
        assert not await vol.exists("/a.txt")
    finally:
        assert await AsyncVolume.destroy(vol.volume_id)
    assert not await AsyncVolume.destroy(vol.volume_id)


async def test_a_volume_token_opens_its_own_volume_only():
    import httpx, os

    one = await AsyncVolume.create(f"vol-one-{uuid.uuid4().hex[:8]}")
    two = await AsyncVolume.create(f"vol-two-{uuid.uuid4().hex[:8]}")
    try:
        await two.write_file("/secret.txt", "two's\n")
        url = os.environ["E2B_VOLUME_API_URL"]
        async with httpx.AsyncClient(base_url=url) as http:
            wrong = await http.get(f"/volumecontent/{two.volume_id}/file", params={"path": "/secret.txt"},
                                   headers={"Authorization": f"Bearer {one.token}"})
            assert wrong.status_code == 401
            none = await http.get(f"/volumecontent/{two.volume_id}/file", params={"path": "/secret.txt"})
            assert none.status_code == 401
            right = await http.get(f"/volumecontent/{two.volume_id}/file", params={"path": "/secret.txt"},
                                   headers={"Authorization": f"Bearer {two.token}"})
            assert right.status_code == 200 and right.text == "two's\n"
    finally:
        await AsyncVolume.destroy(one.volume_id)
        await AsyncVolume.destroy(two.volume_id)


async def test_a_mounted_volume_is_not_destroyed():
    vol = await AsyncVolume.create(f"vol-busy-{uuid.uuid4().hex[:8]}")
    sb = await AsyncSandbox.create(timeout=300, volume_mounts={"/data": vol})
    try:
        from e2b.exceptions import VolumeException

        with pytest.raises(VolumeException) as refused:
            await AsyncVolume.destroy(vol.volume_id)
        assert sb.sandbox_id in str(refused.value)
    finally:
        await sb.kill()
    assert await AsyncVolume.destroy(vol.volume_id)
