// Builds a JavaScript plugin into a component: node build.mjs PLUGIN.js OUT.wasm [WIT_DIR]
// (WIT_DIR defaults to the Wisp tree's wit/; run `npm ci` beside package.json once; ./dev
// plugins and `wisp plugin build` do both). componentize-js takes one
// module, so wisp.js is put in front of the plugin and the plugin's `import ... from "wisp"`
// line is dropped.
import { componentize } from '@bytecodealliance/componentize-js';
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const [input, output, witDir] = process.argv.slice(2);
if (!input || !output) {
  console.error('usage: node build.mjs PLUGIN.js OUT.wasm [WIT_DIR]');
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const wisp = await readFile(join(here, 'wisp.js'), 'utf8');
const plugin = await readFile(input, 'utf8');
const importLine = /^\s*import\s+[^;]*\s+from\s+['"]wisp['"];?\s*$/m;
if (!importLine.test(plugin)) {
  console.error(`${input}: expected an \`import { ... } from "wisp"\` line`);
  process.exit(1);
}
const source = `${wisp}\n// ---- ${input}\n${plugin.replace(importLine, '')}`;
const { component } = await componentize(source, {
  witPath: witDir ?? join(here, '..', '..', 'wit'),
  worldName: 'wisp:plugin/model@0.2.0',
  disableFeatures: ['http', 'fetch-event'],
});
await writeFile(output, component);
console.log(`${output}: ${component.length} bytes`);
