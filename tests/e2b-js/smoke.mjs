// E2B's JS SDK, unchanged, against brigd: create, a command, files in and out, kill. Run by
// tests/tests/e2b.rs from artifacts/node (where scripts/install-deps.sh installed the SDK), with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at the daemon.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

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

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.deepEqual(info.metadata, { sdk: 'js' })
} finally {
  await sbx.kill()
}
assert.equal(await Sandbox.connect(sbx.sandboxId).then(() => 'alive', () => 'gone'), 'gone')
console.log('e2b-js: ok')
