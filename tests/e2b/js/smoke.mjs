// Smoke test of the npm `e2b` SDK against airlockd: create, run, write/read, kill.
// scripts/e2b-tests.sh runs it with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { CommandExitError, Sandbox } from 'e2b'

for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  assert.ok(process.env[name], `${name} must be set`)
}

const sandbox = await Sandbox.create({ metadata: { suite: 'js-smoke' }, timeoutMs: 120_000 })
let killed = false
try {
  assert.ok(await sandbox.isRunning())

  const hello = await sandbox.commands.run('echo "hello $((6*7))"; echo to-err >&2')
  assert.equal(hello.stdout, 'hello 42\n')
  assert.equal(hello.stderr, 'to-err\n')
  assert.equal(hello.exitCode, 0)

  await assert.rejects(sandbox.commands.run('exit 9'), (error) => {
    assert.ok(error instanceof CommandExitError)
    assert.equal(error.exitCode, 9)
    return true
  })

  await sandbox.files.write('/tmp/js/note.txt', 'from node ✓')
  assert.equal(await sandbox.files.read('/tmp/js/note.txt'), 'from node ✓')
  assert.equal((await sandbox.commands.run('cat /tmp/js/note.txt')).stdout, 'from node ✓')

  const blob = randomBytes(1 << 20)
  await sandbox.files.write('/tmp/js/blob.bin', blob.buffer.slice(blob.byteOffset, blob.byteOffset + blob.length))
  const back = await sandbox.files.read('/tmp/js/blob.bin', { format: 'bytes' })
  assert.equal(Buffer.from(back).equals(blob), true)
  const digest = createHash('sha256').update(blob).digest('hex')
  assert.equal((await sandbox.commands.run('sha256sum /tmp/js/blob.bin')).stdout.split(' ')[0], digest)

  assert.equal(await sandbox.kill(), true)
  killed = true
  assert.equal(await sandbox.isRunning(), false)
  assert.equal(await Sandbox.kill(sandbox.sandboxId), false)
} finally {
  if (!killed) await Sandbox.kill(sandbox.sandboxId).catch(() => {})
}
console.log(`e2b npm SDK smoke test done in sandbox ${sandbox.sandboxId}`)
console.log('js-smoke: 1 passed, 0 failed')
