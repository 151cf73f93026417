// E2B's JS SDKs (npm `e2b`, `@e2b/code-interpreter`, unmodified) against an `abx serve`
// gateway, configured by environment variables only (E2B_API_KEY, E2B_API_URL,
// E2B_SANDBOX_URL; docs/e2b.md). ABX_E2B_OTHER_KEY is a second tenant's key, passed the
// way user code passes one (`{ apiKey }`).
//
// `node e2b_flow.mjs sdk|interpreter|template|unsupported` prints one JSON line per step:
// {"step": name, "ok": true, ...what it saw} or {"step": name, "ok": false, "error": {...}}.
// A step that fails does not stop the next (each reports its own result); one that hangs
// is cut off after its time limit.
import { createHash } from 'node:crypto'
import { Sandbox, CommandExitError } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'

const OTHER_KEY = process.env.ABX_E2B_OTHER_KEY

function described(err) {
  return {
    name: err?.name ?? typeof err,
    type: err?.constructor?.name,
    message: String(err?.message ?? err).slice(0, 1000),
    ...(err?.exitCode !== undefined && { exitCode: err.exitCode }),
  }
}

async function step(name, fn, limitMs = 60_000) {
  let timer
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`step did not finish in ${limitMs} ms`)), limitMs)
  })
  try {
    const seen = await Promise.race([fn(), limit])
    console.log(JSON.stringify({ step: name, ok: true, ...seen }))
    return seen
  } catch (err) {
    console.log(JSON.stringify({ step: name, ok: false, error: described(err) }))
    return undefined
  } finally {
    clearTimeout(timer)
  }
}

// What a call that should fail raised ({ raised: ... } or { returned: ... }).
async function outcome(fn) {
  try {
    return { returned: await fn() ?? null }
  } catch (err) {
    return { raised: described(err) }
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function sdk() {
  let sbx
  await step('create', async () => {
    sbx = await Sandbox.create({ metadata: { purpose: 'js-sdk' }, timeoutMs: 120_000 })
    const info = await sbx.getInfo()
    return { id: sbx.sandboxId, template: info.templateId, metadata: info.metadata }
  })
  if (!sbx) return
  const id = sbx.sandboxId

  await step('list', async () => {
    const ids = []
    const pages = Sandbox.list()
    while (pages.hasNext) ids.push(...(await pages.nextItems()).map((s) => s.sandboxId))
    return { listed: ids.includes(id) }
  })
  await step('set_timeout', async () => {
    await sbx.setTimeout(300_000)
    return { running: await sbx.isRunning() }
  })
  await step('update_network', async () => {
    await sbx.updateNetwork({ allowOut: ['pypi.org'] })
    return { refused: await outcome(() => Sandbox.create({ network: {
      allowOut: ['pypi.org'], maskRequestHost: '${PORT}.internal' } })) }
  })
  await step('run', async () => {
    const out = [], err = []
    const r = await sbx.commands.run('echo out; echo err >&2', {
      onStdout: (d) => out.push(d), onStderr: (d) => err.push(d),
    })
    return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr,
             onStdout: out.join(''), onStderr: err.join('') }
  })
  await step('run_envs_cwd', async () => {
    const r = await sbx.commands.run('echo "$GREETING"; pwd', {
      envs: { GREETING: 'hi there' }, cwd: '/tmp' })
    return { stdout: r.stdout }
  })
  await step('run_user', async () => {
    const r = await sbx.commands.run('whoami', { user: 'root' })
    return { stdout: r.stdout }
  })
  await step('run_exit_code', async () => {
    const got = await outcome(() => sbx.commands.run('echo partial; exit 3'))
    const e = got.raised
    return { ...got, isCommandExitError: e?.type === 'CommandExitError',
             instanceOf: await sbx.commands.run('exit 3').catch((x) => x instanceof CommandExitError) }
  })
  await step('run_timeout', async () => outcome(() => sbx.commands.run('sleep 30', { timeoutMs: 1000 })))
  await step('background_kill', async () => {
    const h = await sbx.commands.run('sleep 120', { background: true })
    const listed = (await sbx.commands.list()).map((p) => p.pid)
    const killed = await h.kill()
    const waited = await outcome(() => h.wait())
    const after = (await sbx.commands.list()).map((p) => p.pid)
    return { pid: h.pid, listed: listed.includes(h.pid), killed, waited, gone: !after.includes(h.pid) }
  })
  await step('background_wait', async () => {
    const h = await sbx.commands.run('sleep 1; echo done', { background: true })
    const r = await h.wait()
    return { exitCode: r.exitCode, stdout: r.stdout }
  })
  await step('stdin', async () => {
    const h = await sbx.commands.run('head -n 2', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'first\n')
    await sbx.commands.sendStdin(h.pid, 'second\n')
    const r = await h.wait()
    return { stdout: r.stdout }
  })
  await step('pty', async () => {
    const seen = []
    const term = await sbx.pty.create({ cols: 80, rows: 24,
                                        onData: (d) => seen.push(Buffer.from(d).toString()) })
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $((6*7))\n'))
    for (let i = 0; i < 100 && !seen.join('').includes('42'); i++) await sleep(100)
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
    const killed = await sbx.pty.kill(term.pid)
    return { answered: seen.join('').includes('42'), killed }
  })
  await step('files', async () => {
    await sbx.files.makeDir('/tmp/js/sub')
    const written = await sbx.files.write('/tmp/js/a.txt', 'hello from js')
    const text = await sbx.files.read('/tmp/js/a.txt')
    const bytes = await sbx.files.read('/tmp/js/a.txt', { format: 'bytes' })
    const names = (await sbx.files.list('/tmp/js')).map((e) => `${e.name}:${e.type}`).sort()
    const moved = await sbx.files.rename('/tmp/js/a.txt', '/tmp/js/b.txt')
    const existsOld = await sbx.files.exists('/tmp/js/a.txt')
    const existsNew = await sbx.files.exists('/tmp/js/b.txt')
    await sbx.files.remove('/tmp/js/b.txt')
    return { writtenPath: written.path, text, bytes: Array.from(bytes.slice(0, 5)),
             bytesType: bytes.constructor.name, names, movedPath: moved.path, existsOld,
             existsNew, existsAfterRemove: await sbx.files.exists('/tmp/js/b.txt') }
  })
  await step('read_missing', async () => outcome(() => sbx.files.read('/tmp/js/nope')))
  await step('watch_dir', async () => {
    await sbx.files.makeDir('/tmp/jsw')
    const events = []
    const watch = await sbx.files.watchDir('/tmp/jsw', (e) => events.push(`${e.type}:${e.name}`))
    await sbx.files.write('/tmp/jsw/new.txt', 'x')
    for (let i = 0; i < 100 && !events.some((e) => e.endsWith(':new.txt')); i++) await sleep(100)
    await watch.stop()
    return { events }
  })
  await step('upload_50mb', async () => {
    const data = new Uint8Array(50 * 1024 * 1024)
    for (let i = 0; i < data.length; i += 4096) data[i] = (i / 4096) % 251
    await sbx.files.write('/tmp/big.bin', data)
    const r = await sbx.commands.run('sha256sum /tmp/big.bin; stat -c %s /tmp/big.bin')
    const [sum, size] = r.stdout.trim().split('\n')
    const back = await sbx.files.read('/tmp/big.bin', { format: 'bytes' })
    const expect = createHash('sha256').update(data).digest('hex')
    return { size: Number(size), sameInside: sum.split(' ')[0] === expect,
             sameBack: createHash('sha256').update(back).digest('hex') === expect }
  }, 180_000)
  await step('other_key', async () => {
    const opts = { apiKey: OTHER_KEY }
    const ids = []
    const pages = Sandbox.list(opts)
    while (pages.hasNext) ids.push(...(await pages.nextItems()).map((s) => s.sandboxId))
    return { sees: ids.includes(id), connect: await outcome(() => Sandbox.connect(id, opts)),
             info: await outcome(() => Sandbox.getInfo(id, opts)),
             setTimeout: await outcome(() => Sandbox.setTimeout(id, 5000, opts)),
             kill: await outcome(() => Sandbox.kill(id, opts)),
             stillRunning: await sbx.isRunning() }
  })
  let back
  await step('pause_connect', async () => {
    const paused = await sbx.pause()
    const info = await Sandbox.getInfo(id)
    const pausedAgain = await sbx.pause()
    back = await Sandbox.connect(id)
    return { paused, state: info.state, pausedAgain, running: await back.isRunning(),
             stateAfter: (await Sandbox.getInfo(id)).state }
  }, 120_000)
  await step('after_resume', async () => {
    const r = await back.commands.run('ls -d /tmp/js/sub')  // made by the files step
    return { stdout: r.stdout }
  })
  await step('kill', async () => {
    const killed = await sbx.kill()
    const ids = []
    const pages = Sandbox.list()
    while (pages.hasNext) ids.push(...(await pages.nextItems()).map((s) => s.sandboxId))
    return { killed, listed: ids.includes(id), running: await sbx.isRunning(),
             again: await outcome(() => Sandbox.kill(id)) }
  })
}

async function interpreter() {
  let sbx
  await step('create', async () => {
    sbx = await CodeSandbox.create({ timeoutMs: 300_000 })
    return { id: sbx.sandboxId, template: (await sbx.getInfo()).templateId }
  }, 120_000)
  if (!sbx) return
  try {
    await step('state', async () => {
      await sbx.runCode('x = 41')
      const r = await sbx.runCode('x + 1')
      return { text: r.text, error: r.error ?? null }
    }, 120_000)
    await step('stdout', async () => {
      const seen = []
      const r = await sbx.runCode('print("hello")', { onStdout: (m) => seen.push(m.line) })
      return { stdout: r.logs.stdout, callback: seen }
    })
    await step('error', async () => {
      const r = await sbx.runCode('1 / 0')
      return { name: r.error?.name, value: r.error?.value, hasTraceback: !!r.error?.traceback }
    })
    await step('png', async () => {
      const r = await sbx.runCode(
        'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
      const figure = r.results.find((x) => x.png)
      const png = figure?.png
      const frame = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2]})')
      return { results: r.results.length, error: r.error ?? null,
               pngMagic: png ? Buffer.from(png, 'base64').subarray(1, 4).toString() : null,
               chartType: figure?.chart?.type ?? null,
               chartPoints: figure?.chart?.elements?.[0]?.points ?? null,
               formats: figure?.formats() ?? null, data: frame.results[0]?.data ?? null }
    }, 120_000)
    await step('contexts', async () => {
      const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
      const cwd = await sbx.runCode('import os; os.getcwd()', { context: ctx })
      await sbx.runCode('y = 5', { context: ctx })
      const isolated = await sbx.runCode('"y" in dir()')
      const listed = (await sbx.listCodeContexts()).map((c) => c.id)
      await sbx.restartCodeContext(ctx)
      const afterRestart = await sbx.runCode('"y" in dir()', { context: ctx })
      await sbx.removeCodeContext(ctx)
      const afterRemove = (await sbx.listCodeContexts()).map((c) => c.id)
      return { cwd: cwd.text, isolated: isolated.text, listed: listed.includes(ctx.id),
               afterRestart: afterRestart.text, removed: !afterRemove.includes(ctx.id) }
    }, 120_000)
    await step('typescript', async () => {
      await sbx.runCode('const n: number = 20', { language: 'ts' })
      const r = await sbx.runCode('n * 2 + 2', { language: 'typescript' })
      const err = await sbx.runCode('throw new TypeError("bad " + n)', { language: 'ts' })
      const html = await sbx.runCode('Deno.jupyter.html`<b>${n}</b>`', { language: 'ts' })
      return { text: r.text, error: r.error ?? null, errName: err.error?.name,
               errValue: err.error?.value, html: html.results[0]?.html ?? null }
    }, 120_000)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

// What E2B offers that the gateway does not: the exact error each call gets.
async function unsupported() {
  const { Template, Volume, Secret } = await import('e2b')
  let sbx
  await step('create', async () => {
    sbx = await Sandbox.create()
    return { id: sbx.sandboxId }
  })
  if (!sbx) return
  try {
    // Served (from the sandbox's cgroup), unlike the calls below.
    await step('getMetrics', async () => {
      const samples = await sbx.getMetrics()
      const last = samples[samples.length - 1]
      return { count: samples.length, cpuCount: last.cpuCount, memUsed: last.memUsed,
               memTotal: last.memTotal, diskTotal: last.diskTotal }
    })
    const calls = {
      createSnapshot: () => sbx.createSnapshot(),
      listSnapshots: () => sbx.listSnapshots().nextItems(),
      fork: () => sbx.fork(),
      templateExists: () => Template.exists('base'),
      templateBuild: () => Template.build(Template().fromBaseImage(), 'abx-js-unsupported'),
      volumeList: () => Volume.list(),
      secretCreate: () => Secret.create('abx-js-unsupported', 'value'),
      mcp: () => Sandbox.create({ mcp: { exa: { apiKey: 'x' } } }),
    }
    for (const [name, call] of Object.entries(calls)) {
      await step(name, () => outcome(call))
    }
  } finally {
    await sbx.kill().catch(() => {})
  }
}

// Template() and Template.build: a copy from ABX_E2B_CONTEXT (its file uploaded by hash),
// envs, workdir, a run as another user, the user, a start command with a ready check, tags;
// then a sandbox of it, and the same build again (every step cached).
async function template() {
  const { Template, waitForFile } = await import('e2b')
  const build = (logs) => Template.build(
    Template({ fileContextPath: process.env.ABX_E2B_CONTEXT })
      .fromBaseImage()
      .copy('hello.txt', '/opt/js/', { user: 'user', mode: 0o640 })
      .setEnvs({ JS_GREETING: 'hi from js' })
      .setWorkdir('/opt/js')
      .runCmd('id -un > built-by && echo made > made.txt')
      .runCmd('id -un > /tmp/as-user', { user: 'user' })
      .setUser('user')
      .setStartCmd('echo up > /tmp/js-started && exec sleep 600', waitForFile('/tmp/js-started')),
    'js-template:v1', { tags: ['stable'], onBuildLogs: (e) => logs.push(String(e.message)) })
  await step('build', async () => {
    const logs = []
    const info = await build(logs)
    return { templateId: info.templateId, tags: info.tags, logs }
  }, 300_000)
  await step('sandbox', async () => {
    const sbx = await Sandbox.create('js-template:stable')
    try {
      const run = async (cmd) => (await sbx.commands.run(cmd, { cwd: '/opt/js' })).stdout.trim()
      return {
        whoami: await run('whoami'), greeting: await run('echo $JS_GREETING'),
        hello: await run("stat -c '%U %a' hello.txt && cat hello.txt"),
        built: await run('cat built-by made.txt /tmp/as-user'),
        started: await run('cat /tmp/js-started'),
      }
    } finally {
      await sbx.kill().catch(() => {})
    }
  })
  await step('rebuild', async () => {
    const logs = []
    await build(logs)
    return { logs, exists: await Template.exists('js-template') }
  }, 300_000)
  await step('failing', () => outcome(() => Template.build(
    Template().fromTemplate('js-template').runCmd('exit 9'), 'js-broken')), 300_000)
}

const part = { sdk, interpreter, template, unsupported }[process.argv[2]]
if (!part) {
  console.error('usage: node e2b_flow.mjs sdk|interpreter|template|unsupported')
  process.exit(2)
}
await part()
// Keep-alive sockets of the SDK's undici pools would hold the process open.
process.exit(0)
