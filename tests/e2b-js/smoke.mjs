// E2B's JS SDK, unchanged, against brigd: the key format, create, commands and their pids,
// files in and out, a watched directory, a volume shared by two sandboxes, kill. Run by
// tests/tests/e2b.rs from artifacts/node (where scripts/install-deps.sh installed the SDK), with
// E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_API_KEY pointing at the daemon.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError, Volume, FilesystemEventType } from 'e2b'

// brigd's tokens are E2B API keys.
assert.match(process.env.E2B_API_KEY, /^e2b_[0-9a-f]{64}$/)

const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { sdk: 'js' } })
try {
  const r = await sbx.commands.run('echo from-js; echo err >&2; whoami')
  assert.equal(r.stdout, 'from-js\nuser\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(r.exitCode, 0)
  await assert.rejects(sbx.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)

  const lines = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.1; done', { onStdout: (l) => lines.push(l) })
  assert.deepEqual(lines.join(''), '1\n2\n3\n')

  await sbx.files.write('/home/user/js.txt', 'written from node')
  assert.equal(await sbx.files.read('/home/user/js.txt'), 'written from node')
  const big = new Uint8Array(1 << 20).map((_, i) => i % 251)
  await sbx.files.write('/home/user/big.bin', big.buffer)
  const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.ok(back.every((b, i) => b === big[i]))
  const entries = await sbx.files.list('/home/user')
  assert.ok(entries.some((e) => e.name === 'js.txt'))
  await assert.rejects(sbx.files.read('/no/such/file'), (e) => e instanceof NotFoundError)

  // A background command's pid is its pid in the sandbox: `kill -0` finds it, and the SDK
  // lists and kills it by that pid.
  const bg = await sbx.commands.run('sleep 60', { background: true })
  assert.ok(bg.pid > 1)
  const alive = await sbx.commands.run(`kill -0 ${bg.pid} && cat /proc/${bg.pid}/cmdline | tr '\\0' ' '`)
  assert.equal(alive.stdout, 'sleep 60 ')
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
  assert.equal(await sbx.commands.kill(bg.pid), true)

  // A watched directory tells of a file written in it, of a rename and a mode change as they
  // happen, and (recursive) of a folder made later, with entries when asked.
  const seen = []
  const watch = await sbx.files.watchDir('/home/user', (e) => seen.push(e), { recursive: true, includeEntry: true })
  await sbx.files.write('/home/user/watched.txt', 'w')
  await sbx.commands.run('cd /home/user && chmod 600 watched.txt && mv watched.txt moved.txt && mkdir -p n/m && echo x > n/m/deep.txt')
  for (let i = 0; i < 50 && !seen.some((e) => e.name === 'n/m/deep.txt'); i++) {
    await new Promise((r) => setTimeout(r, 100))
  }
  await watch.stop()
  const saw = (name, type) => seen.some((e) => e.name === name && e.type === type)
  assert.ok(saw('watched.txt', FilesystemEventType.CREATE), JSON.stringify(seen))
  assert.ok(saw('watched.txt', FilesystemEventType.CHMOD), JSON.stringify(seen))
  assert.ok(saw('watched.txt', FilesystemEventType.RENAME), JSON.stringify(seen))
  assert.ok(saw('moved.txt', FilesystemEventType.CREATE), JSON.stringify(seen))
  assert.ok(saw('n/m/deep.txt', FilesystemEventType.CREATE), JSON.stringify(seen))
  assert.equal(seen.find((e) => e.name === 'moved.txt').entry?.path, '/home/user/moved.txt')

  // File metadata is kept with the file, listed, and follows a rename.
  const written = await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { Owner: 'js' } })
  assert.deepEqual(written.metadata, { owner: 'js' })
  await sbx.files.rename('/home/user/meta.txt', '/home/user/meta2.txt')
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta2.txt')).metadata, { owner: 'js' })

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.deepEqual(info.metadata, { sdk: 'js' })
} finally {
  await sbx.kill()
}
assert.equal(await Sandbox.connect(sbx.sandboxId).then(() => 'alive', () => 'gone'), 'gone')

// A volume: written with no sandbox, mounted by two at once.
const vol = await Volume.create(`js-vol-${Date.now()}`)
try {
  await vol.writeFile('/shared.txt', 'from js')
  const a = await Sandbox.create({ timeoutMs: 60_000, volumeMounts: { '/mnt/v': vol } })
  const b = await Sandbox.create({ timeoutMs: 60_000, volumeMounts: { '/mnt/v': vol.name } })
  try {
    assert.equal((await a.commands.run('cat /mnt/v/shared.txt')).stdout, 'from js')
    await b.commands.run('echo from-b > /mnt/v/b.txt')
    assert.equal(await vol.readFile('/b.txt'), 'from-b\n')
  } finally {
    await a.kill()
    await b.kill()
  }
} finally {
  assert.equal(await Volume.destroy(vol.volumeId), true)
}
console.log('e2b-js: ok')
