#!/usr/bin/env node
// Builds TallyHub.sol (with ITallyHub.sol) with the pinned solc-js into
// build/TallyHub.json: {"solc", "abi", "bytecode", "source_sha256"}.
// The settings are fixed and the metadata hash is off, so the same sources
// give the same bytes wherever they are built.
//
//   node build.js           write build/TallyHub.json
//   node build.js --check   rebuild and exit 1 if the checked-in file differs
"use strict";

const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const solc = require("solc");

const DIR = __dirname;
const OUT = path.join(DIR, "build", "TallyHub.json");
const SOURCES = ["ITallyHub.sol", "TallyHub.sol"];

const SETTINGS = {
  evmVersion: "prague",
  optimizer: { enabled: true, runs: 200 },
  viaIR: false,
  metadata: { bytecodeHash: "none" },
  outputSelection: { "TallyHub.sol": { TallyHub: ["abi", "evm.bytecode.object"] } },
};

// Sorted keys at every level, two-space indent, trailing newline.
function canonical(value) {
  const sort = (v) => {
    if (Array.isArray(v)) return v.map(sort);
    if (v && typeof v === "object") {
      const o = {};
      for (const k of Object.keys(v).sort()) o[k] = sort(v[k]);
      return o;
    }
    return v;
  };
  return JSON.stringify(sort(value), null, 2) + "\n";
}

// Compiles `sources` ({name: text}) selecting `select` and returns solc's
// output, throwing on any error (warnings are printed).
function compile(sources, outputSelection, extra = {}) {
  const input = {
    language: "Solidity",
    sources: Object.fromEntries(Object.entries(sources).map(([k, v]) => [k, { content: v }])),
    settings: { ...SETTINGS, outputSelection },
  };
  const findImports = extra.findImports || (() => ({ error: "imports are given as sources" }));
  const out = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
  const errors = (out.errors || []).filter((e) => e.severity === "error");
  for (const e of out.errors || []) {
    if (e.severity !== "error") process.stderr.write(e.formattedMessage + "\n");
  }
  if (errors.length) {
    throw new Error("solc failed:\n" + errors.map((e) => e.formattedMessage).join("\n"));
  }
  return out;
}

function readSources() {
  return Object.fromEntries(SOURCES.map((s) => [s, fs.readFileSync(path.join(DIR, s), "utf8")]));
}

function build() {
  const sources = readSources();
  const out = compile(sources, SETTINGS.outputSelection);
  const c = out.contracts["TallyHub.sol"].TallyHub;
  const sha = {};
  for (const s of SOURCES) sha[s] = crypto.createHash("sha256").update(sources[s], "utf8").digest("hex");
  return canonical({
    solc: solc.version(),
    abi: c.abi,
    bytecode: "0x" + c.evm.bytecode.object,
    source_sha256: sha,
  });
}

module.exports = { compile, canonical, SETTINGS };

if (require.main === module) {
  const text = build();
  if (process.argv.includes("--check")) {
    const have = fs.existsSync(OUT) ? fs.readFileSync(OUT, "utf8") : "";
    if (have !== text) {
      process.stderr.write(`${path.relative(process.cwd(), OUT)} is stale: run node build.js and commit it\n`);
      process.exit(1);
    }
    process.stdout.write("build/TallyHub.json is up to date\n");
  } else {
    fs.mkdirSync(path.dirname(OUT), { recursive: true });
    fs.writeFileSync(OUT, text);
    const size = (JSON.parse(text).bytecode.length - 2) / 2;
    process.stdout.write(`wrote build/TallyHub.json (${solc.version()}, ${size} bytes of init code)\n`);
  }
}
