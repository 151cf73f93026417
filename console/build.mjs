// Builds the console into the Python package (committed there, shipped in the wheel):
// `npm ci && npm run build` here; `abx serve` needs no Node. The suite rebuilds it into a
// temp dir and compares (tests/server/test_console_api.py): ABX_CONSOLE_OUT is where to,
// ABX_CONSOLE_NODE_MODULES where the packages are (npm's cache of the tests).
import { build } from "esbuild";
import { copyFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const src = process.env.ABX_CONSOLE_SRC || join(here, "src");
const out = process.env.ABX_CONSOLE_OUT || join(here, "../agent_sandbox/surfaces/console/static");
const modules = process.env.ABX_CONSOLE_NODE_MODULES;
await build({
  entryPoints: { app: join(src, "main.js") },
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  outdir: out,
  legalComments: "linked",
  nodePaths: modules ? [modules] : [],
  logLevel: "warning",
});
copyFileSync(join(src, "index.html"), join(out, "index.html"));
