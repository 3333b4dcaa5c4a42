// Builds tool.js into a WebAssembly component with componentize-js's JavaScript API.
//
//   node componentize.mjs COMPONENTIZE_JS_MODULE SOURCE WIT_DIR WORLD OUTPUT
//
// COMPONENTIZE_JS_MODULE is the path of componentize-js's `src/componentize.js` (the package is
// installed outside this directory, so it is imported by path). The engine's clock, random and
// HTTP features are left out: the tools need none of them, and the host links no wasi:http.
import { writeFile } from "node:fs/promises";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [modulePath, sourcePath, witPath, worldName, outputPath] = process.argv.slice(2);
if (!outputPath) {
  console.error("usage: node componentize.mjs COMPONENTIZE_JS_MODULE SOURCE WIT_DIR WORLD OUTPUT");
  process.exit(2);
}
const { componentize } = await import(pathToFileURL(resolve(modulePath)).href);
const { component } = await componentize({
  sourcePath: resolve(sourcePath),
  witPath: resolve(witPath),
  worldName,
  disableFeatures: ["http", "fetch-event"],
});
await writeFile(outputPath, component);
console.error(`componentize-js: wrote ${outputPath} (${component.length} bytes)`);
