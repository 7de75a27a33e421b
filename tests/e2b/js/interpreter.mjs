// The npm `@e2b/code-interpreter` SDK against airlockd: template code-interpreter-v1, port 49999.
// scripts/e2b-tests.sh runs it (through tests/e2b/test_js_sdk.py) with the E2B variables set.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const sandbox = await Sandbox.create({ timeoutMs: 600_000 })
console.log(`code interpreter in sandbox ${sandbox.sandboxId}`)
try {
  const out = []
  const err = []
  const execution = await sandbox.runCode('import sys\nprint("js-out")\nprint("js-err", file=sys.stderr)\n6 * 7', {
    onStdout: (m) => out.push(m.line),
    onStderr: (m) => err.push(m.line),
  })
  assert.equal(execution.text, '42')
  assert.deepEqual(out, ['js-out\n'])
  assert.deepEqual(err, ['js-err\n'])

  const failed = await sandbox.runCode('raise ValueError("from js")')
  assert.equal(failed.error.name, 'ValueError')
  assert.equal(failed.error.value, 'from js')
  assert.match(failed.error.traceback, /ValueError/)

  const frame = await sandbox.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})", { timeoutMs: 240_000 })
  assert.match(frame.results[0].html, /<table/)

  const context = await sandbox.createCodeContext({ cwd: '/tmp' })
  await sandbox.runCode('kept = "ctx"', { context })
  assert.equal((await sandbox.runCode('kept', { context })).text, 'ctx')
  const elsewhere = await sandbox.runCode('kept')
  assert.equal(elsewhere.error.name, 'NameError')

  const env = await sandbox.runCode('import os; os.environ["FROM_JS"]', { envs: { FROM_JS: 'yes' } })
  assert.equal(env.text, 'yes')

  // The client's timeout aborts the request; the kernel is interrupted, so the context is free.
  await assert.rejects(sandbox.runCode('import time\nwhile True: time.sleep(0.01)', { context, timeoutMs: 3_000 }))
  assert.equal((await sandbox.runCode('kept', { context, timeoutMs: 120_000 })).text, 'ctx')
} finally {
  await sandbox.kill()
}
console.log('js-interpreter: 1 passed, 0 failed')
