// Bundles each page's src/<page>.js, with the modules it imports (the job page's are in src/job/)
// and uPlot from node_modules, into public/js/ and copies uPlot's stylesheet into public/css/. Each output starts with a banner naming the uPlot version it bundles and a
// digest of the sources, which tests/test_frontend_build.py compares with package-lock.json and
// src/: a stale or mismatched build fails the suite. Run: npm ci && npm run build.
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, writeFileSync, mkdirSync } from "node:fs";
import { join, sep } from "node:path";
import * as esbuild from "esbuild";

const here = new URL(".", import.meta.url).pathname;
const src = join(here, "src");
const uplot = JSON.parse(readFileSync(join(here, "node_modules/uplot/package.json"), "utf8"));

// The digest covers every source file, in src/ and its folders (by path relative to src/, sorted),
// so editing one without building shows.
export function sourceDigest() {
  const hash = createHash("sha256");
  const names = readdirSync(src, { recursive: true }).map((n) => n.split(sep).join("/"));
  for (const name of names.filter((n) => n.endsWith(".js")).sort()) {
    hash.update(name + "\0");
    hash.update(readFileSync(join(src, name)));
    hash.update("\0");
  }
  return hash.digest("hex").slice(0, 16);
}

const banner = `/* trainyard frontend; uplot ${uplot.version}; sources ${sourceDigest()} */`;
const pages = ["job", "dashboard", "node", "submit", "apidocs", "compare", "sweep", "sweepform", "joblist", "network"];

await esbuild.build({
  entryPoints: pages.map((p) => join(src, `${p}.js`)),
  outdir: join(here, "public/js"),
  bundle: true,
  format: "esm",
  minify: true,
  target: ["es2020"],
  banner: { js: banner },
  legalComments: "none",
  logLevel: "info",
});

mkdirSync(join(here, "public/css"), { recursive: true });
const css = readFileSync(join(here, "node_modules/uplot/dist/uPlot.min.css"), "utf8");
writeFileSync(join(here, "public/css/uplot.min.css"), `${banner.replace("frontend", "uplot stylesheet")}\n${css}\n`);
