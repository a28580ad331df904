#!/usr/bin/env node
// Smoke test of TallyHub against a local anvil (127.0.0.1, a port in
// 28700-28799), over plain JSON-RPC. Signatures, keys, digests and ed25519
// verdicts come from test/oracle.py (py_ecc and hashlib, built from
// docs/signing.md), an oracle independent of the contract.
//
//   node test/smoke.js          (after npm ci; needs python3 with py_ecc)
//   ANVIL_HARDFORK=prague node test/smoke.js   (another hardfork than anvil's latest)
//
// Anvil and the oracle are killed on exit, also on failure.
"use strict";

const fs = require("fs");
const path = require("path");
const net = require("net");
const readline = require("readline");
const { spawn } = require("child_process");
const abi = require("./abi");
const { compile } = require("../build");

const DIR = path.join(__dirname, "..");
const CHAIN_ID = "tally-localnet";
const WPC = 10n ** 9n; // wei per credit
const FEE = 5n; // registration fee, credits
const WINDOW = 30000000n;
const SK1 = 0x5a11e1n;
const SK2 = 0xb0b2n;
const SK3 = 0xc0ffee3n;

const children = [];
function cleanup() {
  for (const c of children) {
    if (c.exitCode === null && c.signalCode === null) {
      try {
        c.kill("SIGKILL");
      } catch (_) {}
    }
  }
}
// Kills what the test started and waits until each is gone (reaped), so
// nothing is left behind, not even a zombie.
async function shutdown() {
  cleanup();
  await Promise.all(
    children.map(
      (c) =>
        new Promise((resolve) => {
          if (c.exitCode !== null || c.signalCode !== null) return resolve();
          c.once("exit", resolve);
          setTimeout(resolve, 5000);
        })
    )
  );
}
process.on("exit", cleanup);
for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, () => {
    cleanup();
    process.exit(130);
  });
}

// ---------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------

function findAnvil() {
  const base = path.join(DIR, "node_modules", "@foundry-rs");
  for (const d of fs.readdirSync(base)) {
    const p = path.join(base, d, "bin", "anvil");
    if (d.startsWith("anvil-") && fs.existsSync(p)) return p;
  }
  throw new Error("no anvil binary under node_modules/@foundry-rs: run npm ci");
}

function portFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

let RPC = null;
async function startAnvil() {
  const first = 28700 + (process.pid % 100);
  for (let k = 0; k < 100; k++) {
    const port = 28700 + ((first - 28700 + k) % 100);
    if (!(await portFree(port))) continue;
    const args = ["--host", "127.0.0.1", "--port", String(port), "--quiet"];
    // ANVIL_HARDFORK=prague runs the test on Prague rules (default: anvil's latest).
    if (process.env.ANVIL_HARDFORK) args.push("--hardfork", process.env.ANVIL_HARDFORK);
    const child = spawn(findAnvil(), args, {
      stdio: ["ignore", "ignore", "pipe"],
    });
    children.push(child);
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    RPC = `http://127.0.0.1:${port}`;
    for (let i = 0; i < 100; i++) {
      if (child.exitCode !== null) break;
      try {
        await rpc("eth_chainId", []);
        return port;
      } catch (_) {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    child.kill("SIGKILL");
    throw new Error("anvil did not start: " + stderr);
  }
  throw new Error("no free port in 28700-28799");
}

let oracleNext = null;
function startOracle() {
  const child = spawn("python3", [path.join(__dirname, "oracle.py")], { stdio: ["pipe", "pipe", "inherit"] });
  children.push(child);
  const lines = readline.createInterface({ input: child.stdout });
  const waiting = [];
  lines.on("line", (l) => waiting.shift()(JSON.parse(l)));
  oracleNext = (req) =>
    new Promise((resolve, reject) => {
      waiting.push((res) => (res.error ? reject(new Error("oracle: " + res.error)) : resolve(res.ok)));
      child.stdin.write(JSON.stringify(req, (_, v) => (typeof v === "bigint" ? v.toString() : v)) + "\n");
    });
}
const oracle = (req) => oracleNext(req);

// ---------------------------------------------------------------------
// JSON-RPC and contracts
// ---------------------------------------------------------------------

let rpcId = 0;
async function rpc(method, params) {
  const res = await fetch(RPC, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: ++rpcId, method, params }),
  });
  const body = await res.json();
  if (body.error) {
    const e = new Error(`${method}: ${body.error.message}`);
    e.rpc = body.error;
    throw e;
  }
  return body.result;
}

async function receiptOf(hash) {
  for (let i = 0; i < 600; i++) {
    const r = await rpc("eth_getTransactionReceipt", [hash]);
    if (r) return r;
    await new Promise((res) => setTimeout(res, 20));
  }
  throw new Error("no receipt for " + hash);
}

const hexOf = (n) => "0x" + BigInt(n).toString(16);
const utf8Hex = (s) => "0x" + Buffer.from(s, "utf8").toString("hex");
async function keccak(hexData) {
  return rpc("web3_sha3", [hexData]);
}

class Reverted extends Error {
  constructor(name, args, data) {
    super(`reverted ${name}(${args.map(String).join(", ")})`);
    this.errorName = name;
    this.args = args;
    this.data = data;
  }
}

class Contract {
  constructor(abiJson, address) {
    this.abi = abiJson;
    this.address = address;
  }

  async init() {
    this.fns = {};
    this.errors = {};
    this.events = {};
    for (const e of this.abi) {
      if (e.type === "function") {
        const sig = abi.signature(e);
        this.fns[e.name] = { ...e, selector: (await keccak(utf8Hex(sig))).slice(0, 10) };
      } else if (e.type === "error") {
        this.errors[(await keccak(utf8Hex(abi.signature(e)))).slice(0, 10)] = e;
      } else if (e.type === "event") {
        this.events[await keccak(utf8Hex(abi.signature(e)))] = e;
      }
    }
    return this;
  }

  data(name, args) {
    const f = this.fns[name];
    if (!f) throw new Error("no function " + name);
    return f.selector + abi.encode(f.inputs, args);
  }

  decodeError(data) {
    if (!data || data === "0x") return new Reverted("(empty)", [], data);
    const e = this.errors[data.slice(0, 10)];
    if (!e) {
      if (data.startsWith("0x08c379a0")) {
        return new Reverted("Error", abi.decode([{ type: "string" }], "0x" + data.slice(10)), data);
      }
      return new Reverted("(unknown " + data.slice(0, 10) + ")", [], data);
    }
    return new Reverted(e.name, abi.decode(e.inputs, "0x" + data.slice(10)), data);
  }

  async call(name, args = [], opts = {}) {
    const tx = { to: this.address, data: this.data(name, args), ...txOpts(opts) };
    let out;
    try {
      out = await rpc("eth_call", [tx, "latest"]);
    } catch (e) {
      throw this.revertOf(e);
    }
    const vals = abi.decode(this.fns[name].outputs, out);
    return vals.length === 1 ? vals[0] : vals;
  }

  revertOf(e) {
    if (!e.rpc) return e;
    const d = e.rpc.data;
    const data = typeof d === "string" ? d : d && typeof d.data === "string" ? d.data : null;
    if (data === null) return e;
    return this.decodeError(data);
  }

  async send(name, args = [], opts = {}) {
    const tx = { to: this.address, data: this.data(name, args), ...txOpts(opts) };
    let hash;
    try {
      hash = await rpc("eth_sendTransaction", [tx]);
    } catch (e) {
      throw this.revertOf(e);
    }
    const receipt = await receiptOf(hash);
    receipt.events = receipt.logs.map((l) => this.decodeLog(l)).filter(Boolean);
    receipt.gas = BigInt(receipt.gasUsed);
    return receipt;
  }

  decodeLog(log) {
    const e = this.events[log.topics[0]];
    if (!e || log.address.toLowerCase() !== this.address.toLowerCase()) return null;
    const out = { name: e.name };
    const plain = e.inputs.filter((i) => !i.indexed);
    const vals = abi.decode(plain, log.data);
    let t = 1;
    for (const i of e.inputs) {
      out[i.name] = i.indexed ? abi.decode([i], log.topics[t++])[0] : vals[plain.indexOf(i)];
    }
    return out;
  }

  // Expects `name(args)` to revert with error `errName` (by eth_call);
  // returns the error's arguments.
  async reverts(name, args, opts, errName) {
    try {
      await this.call(name, args, opts);
    } catch (e) {
      if (!(e instanceof Reverted)) throw e;
      if (e.errorName !== errName) {
        throw new Error(`${name}: expected ${errName}, got ${e.message}`);
      }
      return e.args;
    }
    throw new Error(`${name}: expected ${errName}, but it succeeded`);
  }
}

function txOpts(o) {
  const t = {};
  if (o.from) t.from = o.from;
  if (o.value !== undefined) t.value = hexOf(o.value);
  if (o.gas !== undefined) t.gas = hexOf(o.gas);
  return t;
}

async function deploy(artifact, args, from) {
  const ctor = artifact.abi.find((e) => e.type === "constructor");
  const data = artifact.bytecode + abi.encode(ctor.inputs, args);
  const hash = await rpc("eth_sendTransaction", [{ from, data, gas: hexOf(15_000_000) }]);
  const r = await receiptOf(hash);
  if (r.status !== "0x1") throw new Error("deployment failed");
  return new Contract(artifact.abi, r.contractAddress).init();
}

// Deployment that must fail: the revert reason from eth_call.
async function deployReverts(artifact, args, from) {
  const ctor = artifact.abi.find((e) => e.type === "constructor");
  const data = artifact.bytecode + abi.encode(ctor.inputs, args);
  try {
    await rpc("eth_call", [{ from, data, gas: hexOf(15_000_000) }, "latest"]);
  } catch (e) {
    const c = await new Contract(artifact.abi, "0x").init();
    return c.revertOf(e);
  }
  throw new Error("deployment succeeded but should not");
}

// ---------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------

let checks = 0;
function eq(actual, expected, what) {
  const a = typeof actual === "bigint" || typeof actual === "number" ? BigInt(actual) : actual;
  const b = typeof expected === "bigint" || typeof expected === "number" ? BigInt(expected) : expected;
  const same = typeof a === "string" && typeof b === "string" ? a.toLowerCase() === b.toLowerCase() : a === b;
  if (!same) throw new Error(`${what}: got ${actual}, want ${expected}`);
  checks++;
}
function ok(cond, what) {
  if (!cond) throw new Error(what);
  checks++;
}
function section(name) {
  process.stdout.write(`-- ${name}\n`);
}

// ---------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------

const call = (id, user, provider, amount, kind = 0) => ({
  id: BigInt(id),
  user,
  provider,
  amount: BigInt(amount),
  window: WINDOW,
  kind: BigInt(kind),
});
const oracleCalls = (calls) =>
  calls.map((c) => ({ ...c, id: String(c.id), amount: String(c.amount), window: String(c.window), kind: Number(c.kind) }));

async function signBatch(hub, nonce, calls, secret, extra = {}) {
  const r = await oracle({ op: "sign_batch", secret: String(secret), hub, nonce: Number(nonce), chain_id: CHAIN_ID, calls: oracleCalls(calls), ...extra });
  return "0x" + r.sig;
}

async function main() {
  // The checked-in artifact must be what the sources build to.
  const artifact = JSON.parse(fs.readFileSync(path.join(DIR, "build", "TallyHub.json"), "utf8"));
  const sources = {};
  for (const s of ["ITallyHub.sol", "TallyHub.sol"]) sources[s] = fs.readFileSync(path.join(DIR, s), "utf8");
  sources["test/DigestHarness.sol"] = fs.readFileSync(path.join(__dirname, "DigestHarness.sol"), "utf8");
  const built = compile(sources, {
    "TallyHub.sol": { TallyHub: ["abi", "evm.bytecode.object"] },
    "test/DigestHarness.sol": { DigestHarness: ["abi", "evm.bytecode.object"] },
  });
  eq("0x" + built.contracts["TallyHub.sol"].TallyHub.evm.bytecode.object, artifact.bytecode, "build/TallyHub.json is the sources' build");
  const harnessArt = {
    abi: built.contracts["test/DigestHarness.sol"].DigestHarness.abi,
    bytecode: "0x" + built.contracts["test/DigestHarness.sol"].DigestHarness.evm.bytecode.object,
  };

  startOracle();
  const port = await startAnvil();
  const info = await rpc("anvil_nodeInfo", []).catch(() => ({}));
  process.stdout.write(`anvil on 127.0.0.1:${port} (hardfork ${info.hardFork || "?"})\n`);
  const accounts = await rpc("eth_accounts", []);
  const [relay, aliceAddr, bobAddr, gov1, gov2, gov3, carolAddr, stranger] = accounts;

  const k1 = await oracle({ op: "key", secret: String(SK1) });
  const k2 = await oracle({ op: "key", secret: String(SK2) });
  const k3 = await oracle({ op: "key", secret: String(SK3) });
  const key = (k) => "0x" + k.key;
  const point = (k) => "0x" + k.point;

  // -------------------------------------------------------------------
  section("deployment");
  const ctorArgs = (over = {}) => {
    const a = { chain: CHAIN_ID, key: key(k1), point: point(k1), rot: 0n, wpc: WPC, fee: FEE, govs: [gov1, gov2, gov3], t: 2n, ...over };
    return [a.chain, a.key, a.point, a.rot, a.wpc, a.fee, a.govs, a.t];
  };
  const hub = await deploy(artifact, ctorArgs(), relay);
  const chainid = BigInt(await rpc("eth_chainId", []));
  const HUB = `evm:${chainid}:0x${hub.address.slice(2).toLowerCase()}`;
  eq(await hub.call("hubName"), HUB, "hubName");
  eq(await hub.call("tallyChainId"), CHAIN_ID, "tallyChainId");
  eq(await hub.call("groupKey"), key(k1), "groupKey");
  eq(await hub.call("weiPerCredit"), WPC, "weiPerCredit");
  eq(await hub.call("registrationFee"), FEE, "registrationFee");
  eq(await hub.call("lastNonce"), 0n, "lastNonce");
  eq(await hub.call("lastRotation"), 0n, "lastRotation");
  eq(await hub.call("governorThreshold"), 2n, "governorThreshold");
  eq(await hub.call("isGovernor", [gov2]), true, "gov2 is a governor");
  eq(await hub.call("isGovernor", [stranger]), false, "stranger is not a governor");
  const code = await rpc("eth_getCode", [hub.address, "latest"]);
  process.stdout.write(`   hub ${HUB}, runtime ${(code.length - 2) / 2} bytes\n`);

  // The constructor checks its key as rotateKey does, and its governors.
  const off = await oracle({ op: "off_subgroup" });
  const badKeys = {
    "point of another key": [key(k1), point(k2)],
    "sign flag flipped": [key(k1).slice(0, 2) + (parseInt(key(k1).slice(2, 4), 16) ^ 0x20).toString(16).padStart(2, "0") + key(k1).slice(4), point(k1)],
    "compression flag clear": [key(k1).slice(0, 2) + (parseInt(key(k1).slice(2, 4), 16) & 0x7f).toString(16).padStart(2, "0") + key(k1).slice(4), point(k1)],
    "infinity flag set": [key(k1).slice(0, 2) + (parseInt(key(k1).slice(2, 4), 16) | 0x40).toString(16).padStart(2, "0") + key(k1).slice(4), point(k1)],
    "infinity": ["0xc0" + "00".repeat(47), "0x" + "00".repeat(128)],
    "off the subgroup": ["0x" + off.key, "0x" + off.point],
    "off the curve": [key(k1), point(k1).slice(0, -2) + ((parseInt(point(k1).slice(-2), 16) + 1) % 256).toString(16).padStart(2, "0")],
    "47 bytes": [key(k1).slice(0, -2), point(k1)],
    "point 127 bytes": [key(k1), point(k1).slice(0, -2)],
  };
  for (const [what, [k, p]] of Object.entries(badKeys)) {
    const e = await deployReverts(artifact, ctorArgs({ key: k, point: p }), relay);
    eq(e.errorName, "BadKey", `constructor refuses a key: ${what}`);
  }
  for (const [what, over] of Object.entries({
    "threshold below a majority": { t: 1n },
    "threshold above the governors": { t: 4n },
    "threshold without governors": { govs: [], t: 1n },
    "a governor twice": { govs: [gov1, gov1, gov2], t: 2n },
    "empty chain id": { chain: "" },
    "zero weiPerCredit": { wpc: 0n },
  })) {
    const e = await deployReverts(artifact, ctorArgs(over), relay);
    eq(e.errorName, "Error", `constructor refuses ${what}`);
  }

  // -------------------------------------------------------------------
  section("digests (test harness, never deployed for real)");
  const harness = await deploy(harnessArt, ["hub", CHAIN_ID, key(k1), point(k1)], relay);
  const example = [call(1, "alice", "acme-ai", 36)];
  eq(
    await harness.call("batchDigest", [1n, example]),
    "0x7a89b4145545b1eed1de2c0044301dadaff6992c332e0b3baafbafdbe5b66c0b",
    "docs/signing.md section 4 worked example digest"
  );
  const v2calls = [call(7, "alice", "acme-ai", 36), call(9, "bob", "", 5, 1), call(12, "x.y_z:1/2-3", "P", 1)];
  eq(
    await harness.call("batchDigest", [5n, v2calls]),
    "0x" + (await oracle({ op: "batch_digest", hub: "hub", nonce: 5, calls: oracleCalls(v2calls) })).digest,
    "version 2 digest equals the oracle's"
  );
  eq(
    await harness.call("rotationDigest", [3n, 8n, key(k2)]),
    "0x" + (await oracle({ op: "rotation_digest", hub: "hub", nonce: 3, epoch: 8, key: k2.key })).digest,
    "rotation digest equals the oracle's"
  );
  const exSig = await signBatch("hub", 1, example, SK1);
  const verifyGas = await harness.call("verifyGas", [1n, "0x7a89b4145545b1eed1de2c0044301dadaff6992c332e0b3baafbafdbe5b66c0b", exSig]);
  process.stdout.write(`   signature check alone: ${verifyGas} gas\n`);
  ok(verifyGas > 150000n && verifyGas < 175000n, "signature check gas in the expected range");

  // -------------------------------------------------------------------
  section("deposits");
  const ALICE_PK = "0xd75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"; // RFC 8032 test 1
  const OTHER_PK = "0x3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"; // RFC 8032 test 2
  let r = await hub.send("deposit", ["alice", ALICE_PK], { from: aliceAddr, value: 100n * WPC });
  let ev = r.events.find((e) => e.name === "Deposited");
  eq(ev.seq, 1n, "deposit 1 seq");
  eq(ev.user, "alice", "deposit 1 user");
  eq(ev.amount, 95n, "deposit 1 credits the amount less the fee");
  eq(ev.pubkey, ALICE_PK, "deposit 1 carries the key it binds");
  eq(ev.fee, FEE, "deposit 1 fee");
  eq(ev.from, aliceAddr, "deposit 1 from");
  eq(await hub.call("escrow", ["alice"]), 95n, "alice escrow");
  eq(await hub.call("userKey", ["alice"]), ALICE_PK, "alice key");
  eq(await hub.call("userAddress", ["alice"]), aliceAddr, "alice address");
  eq(await hub.call("fees"), FEE, "fees");
  // A top-up with the same key: no fee, no key in the record.
  r = await hub.send("deposit", ["alice", ALICE_PK], { from: carolAddr, value: 10n * WPC });
  ev = r.events[0];
  eq(ev.amount, 10n, "same-key top-up credits all");
  eq(ev.pubkey, "0x", "same-key top-up records no key");
  eq(ev.fee, 0n, "same-key top-up pays no fee");
  eq(await hub.call("userAddress", ["alice"]), aliceAddr, "a top-up by another sender keeps the user's address");
  r = await hub.send("deposit", ["bob", "0x"], { from: bobAddr, value: 50n * WPC });
  eq(r.events[0].seq, 3n, "deposit 3 seq");
  eq(await hub.call("userKey", ["bob"]), "0x", "bob has no key");
  eq(await hub.call("depositCount"), 3n, "depositCount");
  const refusals = {
    "another key for alice": [["alice", OTHER_PK], 10n * WPC, "bound to another key"],
    "a key for bob, who holds credits": [["bob", OTHER_PK], 10n * WPC, "already holds credits"],
    "a key deposit at the fee": [["dave", OTHER_PK], FEE * WPC, "above the registration fee"],
    "an invalid ed25519 key": [["dave", "0x0200000000000000000000000000000000000000000000000000000000000000"], 10n * WPC, "not an ed25519 point"],
    "a 31-byte key": [["dave", "0x" + "11".repeat(31)], 10n * WPC, "not 32 bytes"],
    "zero value": [["dave", "0x"], 0n, "positive multiple"],
    "a value not a multiple of weiPerCredit": [["dave", "0x"], WPC + 1n, "positive multiple"],
    "a bad user": [["da ve", "0x"], WPC, "identifier"],
    "an empty user": [["", "0x"], WPC, "identifier"],
    "a 65-byte user": [["u".repeat(65), "0x"], WPC, "identifier"],
  };
  for (const [what, [args, value, why]] of Object.entries(refusals)) {
    const [reason] = await hub.reverts("deposit", args, { from: carolAddr, value }, "BadDeposit");
    ok(reason.includes(why), `deposit refuses ${what}: ${reason}`);
  }
  await hub.send("deposit", ["u".repeat(64), "0x"], { from: carolAddr, value: WPC });
  // Identifiers, every byte value at the edges of both words, against
  // the charset itself (the batch's checks use the same function).
  {
    const allowed = new Set(Buffer.from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/-"));
    const cases = [];
    for (let b = 0; b < 256; b++) {
      for (const [len, at] of [[1, 0], [31, 30], [32, 31], [33, 32], [64, 0], [64, 63]]) {
        const name = Buffer.alloc(len, "a".charCodeAt(0));
        name[at] = b;
        cases.push([name, allowed.has(b)]);
      }
    }
    for (let i = 0; i < cases.length; i += 64) {
      await Promise.all(
        cases.slice(i, i + 64).map(async ([name, want]) => {
          let accepted = true;
          try {
            await hub.call("deposit", [name, "0x"], { from: carolAddr, value: WPC });
          } catch (e) {
            if (!(e instanceof Reverted) || e.errorName !== "BadDeposit") throw e;
            accepted = false;
          }
          eq(accepted, want, `identifier ${name.toString("hex")}`);
        })
      );
    }
    process.stdout.write(`   identifiers: ${cases.length} byte/position cases agree with the charset\n`);
  }
  {
    const tiny = await deploy(artifact, ctorArgs({ wpc: 1n }), relay);
    const [reason] = await tiny.reverts("deposit", ["dave", "0x"], { from: carolAddr, value: 1n << 64n }, "BadDeposit");
    ok(reason.includes("64 bits"), "deposit refuses credits beyond u64: " + reason);
    await tiny.send("deposit", ["dave", "0x"], { from: carolAddr, value: (1n << 64n) - 1n });
    eq(await tiny.call("escrow", ["dave"]), (1n << 64n) - 1n, "escrow holds 2^64 - 1");
    const [why] = await tiny.reverts("deposit", ["dave", "0x"], { from: carolAddr, value: 1n }, "BadDeposit");
    ok(why.includes("overflow"), "deposit refuses an escrow overflow: " + why);
  }
  // ed25519 keys, differential against the oracle (dalek's decompression):
  // non-canonical y (>= p), the sign bit, and pseudo-random keys.
  const edKeys = [
    "ed" + "ff".repeat(30) + "7f", // y = p (non-canonical, = 0)
    "ee" + "ff".repeat(30) + "7f", // y = p + 1 (= 1)
    "ff".repeat(32), // y = 2^255 - 1, sign bit set
    "00".repeat(32), // y = 0
    "01" + "00".repeat(30) + "80", // y = 1, sign bit set ("negative zero")
    "ec" + "ff".repeat(30) + "7f", // y = p - 1
    ALICE_PK.slice(2),
    OTHER_PK.slice(2),
  ];
  let seed = 0x1234567n;
  for (let i = 0; i < 40; i++) {
    let h = "";
    for (let j = 0; j < 32; j++) {
      seed = (seed * 6364136223846793005n + 1442695040888963407n) % (1n << 64n);
      h += ((seed >> 33n) & 0xffn).toString(16).padStart(2, "0");
    }
    edKeys.push(h);
  }
  const verdicts = (await oracle({ op: "ed25519_valid", keys: edKeys })).valid;
  let valid = 0;
  for (let i = 0; i < edKeys.length; i++) {
    let accepted = true;
    try {
      await hub.call("deposit", [`ed${i}`, "0x" + edKeys[i]], { from: carolAddr, value: 10n * WPC });
    } catch (e) {
      if (!(e instanceof Reverted) || e.errorName !== "BadDeposit") throw e;
      ok(e.args[0].includes("ed25519"), "only the point check refuses these");
      accepted = false;
    }
    eq(accepted, verdicts[i], `ed25519 key ${edKeys[i]} accepted as dalek would`);
    if (accepted) valid++;
  }
  ok(valid > 5 && valid < edKeys.length - 5, "both valid and invalid ed25519 keys were tried");
  process.stdout.write(`   ed25519: ${edKeys.length} keys agree with the oracle (${valid} valid)\n`);

  // -------------------------------------------------------------------
  section("batches");
  const b1 = [call(1, "alice", "acme-ai", 36), call(2, "bob", "acme-ai", 10), call(3, "alice", "zeta", 4)];
  const sig1 = await signBatch(HUB, 1, b1, SK1);
  r = await hub.send("submitBatch", [1n, b1, sig1], { from: relay });
  eq(r.status, "0x1", "batch 1 settles");
  ev = r.events.find((e) => e.name === "BatchSettled");
  eq(ev.nonce, 1n, "BatchSettled nonce");
  eq(ev.calls, 3n, "BatchSettled calls");
  eq(ev.paid, 50n, "BatchSettled paid");
  eq(ev.withdrawn, 0n, "BatchSettled withdrawn");
  process.stdout.write(`   batch of 3 calls: ${r.gas} gas\n`);
  eq(await hub.call("payout", ["acme-ai"]), 46n, "acme-ai paid");
  eq(await hub.call("payout", ["zeta"]), 4n, "zeta paid");
  eq(await hub.call("escrow", ["alice"]), 105n - 40n, "alice escrow after batch 1");
  eq(await hub.call("escrow", ["bob"]), 40n, "bob escrow after batch 1");
  eq(await hub.call("lastNonce"), 1n, "lastNonce 1");
  eq(await hub.call("settledAt", [1n]), BigInt(r.blockNumber), "settledAt 1");
  eq(await hub.call("settledAt", [2n]), 0n, "settledAt 2 unset");

  let args = await hub.reverts("submitBatch", [1n, b1, sig1], {}, "AlreadySettled");
  eq(args[0], 1n, "replay: nonce");
  eq(args[1], 1n, "replay: last");
  args = await hub.reverts("submitBatch", [0n, b1, sig1], {}, "AlreadySettled");
  eq(args[0], 0n, "nonce 0 is settled");
  args = await hub.reverts("submitBatch", [3n, b1, sig1], {}, "NonceGap");
  eq(args[1], 2n, "gap: expected 2");

  const b2 = [call(4, "alice", "acme-ai", 5), call(5, "bob", "zeta", 6)];
  const sig2 = await signBatch(HUB, 2, b2, SK1);
  // Tampering, other tags, other keys, malformed signatures.
  await hub.reverts("submitBatch", [2n, [call(4, "alice", "acme-ai", 6), b2[1]], sig2], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, [call(4, "alice", "evil", 5), b2[1]], sig2], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, [b2[0]], sig2], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, await signBatch(HUB, 2, b2, SK1, { standard: true })], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, await signBatch("hub", 2, b2, SK1)], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, await signBatch(HUB, 2, b2, SK2)], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, sig1], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, sig2.slice(0, -2)], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, "0x" + "00".repeat(256)], {}, "BadSignature");
  await hub.reverts("submitBatch", [2n, b2, "0x" + "11".repeat(256)], {}, "BadSignature");
  // The same call ids, users and amounts read as a withdrawal: another digest.
  await hub.reverts("submitBatch", [2n, [b2[0], call(5, "bob", "", 6, 1)], sig2], {}, "BadSignature");
  // A garbage signature burns no more gas than a valid one would.
  r = await hub.send("submitBatch", [2n, b2, "0x" + "11".repeat(256)], { from: relay, gas: 5_000_000n });
  eq(r.status, "0x0", "a garbage signature fails");
  ok(r.gas < 250_000n, `a garbage signature burns little gas (${r.gas})`);

  // Malformed batches.
  const bad = {
    "no calls": [[], "at least one call"],
    "1001 calls": [Array.from({ length: 1001 }, (_, i) => call(i + 1, "alice", "p", 1)), "at most 1000"],
    "ids not ascending": [[call(5, "alice", "p", 1), call(5, "bob", "p", 1)], "ascending"],
    "ids descending": [[call(6, "alice", "p", 1), call(5, "bob", "p", 1)], "ascending"],
    "a bad user": [[call(5, "al ice", "p", 1)], "user"],
    "an empty user": [[call(5, "", "p", 1)], "user"],
    "a 65-byte provider": [[call(5, "alice", "p".repeat(65), 1)], "provider"],
    "a payment without provider": [[call(5, "alice", "", 1)], "provider"],
    "a withdrawal with a provider": [[call(5, "alice", "p", 1, 1)], "withdrawal"],
    "kind 2": [[call(5, "alice", "", 1, 2)], "kind"],
    "a zero amount": [[call(5, "alice", "p", 0)], "amount"],
  };
  for (const [what, [calls, why]] of Object.entries(bad)) {
    const [, reason] = await hub.reverts("submitBatch", [2n, calls, sig2], {}, "BadBatch");
    ok(reason.includes(why), `BadBatch for ${what}: ${reason}`);
  }
  await hub.call("submitBatch", [2n, b2, sig2]); // still fine as an eth_call

  // Overdraft: alice owes 61 + 5 = 66 > 65 in escrow; nothing paid.
  const od = [call(4, "alice", "acme-ai", 61), call(5, "bob", "zeta", 6), call(6, "alice", "omega", 5)];
  const sigOd = await signBatch(HUB, 2, od, SK1);
  args = await hub.reverts("submitBatch", [2n, od, sigOd], {}, "InsufficientEscrow");
  eq(args[0], "alice", "overdraft user");
  eq(args[1], 66n, "overdraft owed");
  eq(args[2], 65n, "overdraft escrow");
  r = await hub.send("submitBatch", [2n, od, sigOd], { from: relay, gas: 1_000_000n });
  eq(r.status, "0x0", "the overdraft transaction fails");
  eq(await hub.call("payout", ["acme-ai"]), 46n, "overdraft paid nothing to acme-ai");
  eq(await hub.call("payout", ["omega"]), 0n, "overdraft paid nothing to omega");
  eq(await hub.call("escrow", ["bob"]), 40n, "overdraft took nothing from bob");
  eq(await hub.call("lastNonce"), 1n, "overdraft left the nonce open");

  // Low gas: LowGas, never BadSignature, and nothing settles.
  args = await hub.reverts("submitBatch", [2n, b2, sig2], { gas: 150_000n }, "LowGas");
  ok(args[1] < args[0], `LowGas(${args[0]}, ${args[1]})`);
  args = await hub.reverts("submitBatch", [2n, b2, "0x" + "11".repeat(256)], { gas: 150_000n }, "LowGas");
  r = await hub.send("submitBatch", [2n, b2, sig2], { from: relay, gas: 150_000n });
  eq(r.status, "0x0", "the low-gas transaction fails");
  eq(await hub.call("lastNonce"), 1n, "low gas settled nothing");
  // What eth_estimateGas finds is enough (the relay will rely on it).
  const est = BigInt(await rpc("eth_estimateGas", [{ from: relay, to: hub.address, data: hub.data("submitBatch", [2n, b2, sig2]) }]));
  r = await hub.send("submitBatch", [2n, b2, sig2], { from: relay, gas: est });
  eq(r.status, "0x1", `batch 2 settles with exactly the estimate (${est})`);
  eq(await hub.call("payout", ["acme-ai"]), 51n, "acme-ai after batch 2");

  // A withdrawal (version 2 digest): credits go back to bob's address.
  const b3 = [call(10, "bob", "", 20, 1), call(11, "alice", "acme-ai", 1)];
  r = await hub.send("submitBatch", [3n, b3, await signBatch(HUB, 3, b3, SK1)], { from: relay });
  ev = r.events.find((e) => e.name === "BatchSettled");
  eq(ev.paid, 1n, "batch 3 paid");
  eq(ev.withdrawn, 20n, "batch 3 withdrawn");
  eq(await hub.call("withdrawn", ["bob"]), 20n, "bob withdrawn credits");
  eq(await hub.call("escrow", ["bob"]), 14n, "bob escrow after withdrawal");
  eq(await hub.call("withdrawable", [bobAddr]), 20n * WPC, "bob's address may withdraw");
  const before = BigInt(await rpc("eth_getBalance", [bobAddr, "latest"]));
  r = await hub.send("withdraw", [], { from: bobAddr });
  const after = BigInt(await rpc("eth_getBalance", [bobAddr, "latest"]));
  const gasCost = BigInt(r.gasUsed) * BigInt(r.effectiveGasPrice);
  eq(after - before + gasCost, 20n * WPC, "withdraw sent the wei");
  ev = r.events.find((e) => e.name === "Withdrawn");
  eq(ev.to, bobAddr, "Withdrawn to");
  eq(ev.amountWei, 20n * WPC, "Withdrawn amount");
  eq(await hub.call("withdrawable", [bobAddr]), 0n, "nothing left to withdraw");
  await hub.reverts("withdraw", [], { from: bobAddr }, "NothingToWithdraw");

  // -------------------------------------------------------------------
  section("key rotation");
  const rotSig = async (nonce, epoch, k, secret) =>
    "0x" + (await oracle({ op: "sign_rotation", secret: String(secret), hub: HUB, nonce, epoch, key: k.key, chain_id: CHAIN_ID })).sig;
  const rs = await rotSig(1, 1, k2, SK1);
  await hub.reverts("rotateKey", [1n, 1n, key(k2), point(k2), await rotSig(1, 1, k2, SK2)], {}, "BadSignature");
  await hub.reverts("rotateKey", [1n, 2n, key(k2), point(k2), rs], {}, "BadSignature");
  await hub.reverts("rotateKey", [1n, 1n, key(k2), point(k3), rs], {}, "BadKey");
  await hub.reverts("rotateKey", [1n, 1n, "0x" + off.key, "0x" + off.point, rs], {}, "BadKey");
  await hub.reverts("rotateKey", [2n, 1n, key(k2), point(k2), rs], {}, "RotationGap");
  await hub.reverts("rotateKey", [1n, 1n, key(k2), point(k2), rs], { gas: 120_000n }, "LowGas");
  r = await hub.send("rotateKey", [1n, 1n, key(k2), point(k2), rs], { from: relay });
  ev = r.events.find((e) => e.name === "KeyRotated");
  eq(ev.nonce, 1n, "KeyRotated nonce");
  eq(ev.epoch, 1n, "KeyRotated epoch");
  eq(ev.groupKey, key(k2), "KeyRotated key");
  eq(ev.governed, false, "KeyRotated not governed");
  process.stdout.write(`   rotateKey: ${r.gas} gas\n`);
  eq(await hub.call("groupKey"), key(k2), "groupKey is k2");
  eq(await hub.call("lastRotation"), 1n, "lastRotation 1");
  args = await hub.reverts("rotateKey", [1n, 1n, key(k2), point(k2), rs], {}, "RotationApplied");
  eq(args[1], 1n, "RotationApplied last");
  const b4 = [call(12, "alice", "acme-ai", 2)];
  await hub.reverts("submitBatch", [4n, b4, await signBatch(HUB, 4, b4, SK1)], {}, "BadSignature");
  r = await hub.send("submitBatch", [4n, b4, await signBatch(HUB, 4, b4, SK2)], { from: relay });
  eq(r.status, "0x1", "the new key signs batch 4");

  // -------------------------------------------------------------------
  section("governed rotation");
  args = await hub.reverts("governKey", [2n, 5n, key(k3), point(k3)], { from: stranger }, "NotGovernor");
  eq(args[0], stranger, "NotGovernor caller");
  await hub.reverts("governKey", [3n, 5n, key(k3), point(k3)], { from: gov1 }, "RotationGap");
  await hub.reverts("governKey", [1n, 5n, key(k3), point(k3)], { from: gov1 }, "RotationApplied");
  await hub.reverts("governKey", [2n, 5n, key(k3), point(k2)], { from: gov1 }, "BadKey");
  r = await hub.send("governKey", [2n, 5n, key(k3), point(k3)], { from: gov1 });
  ev = r.events.find((e) => e.name === "GovernorApproved");
  eq(ev.approvals, 1n, "first approval");
  eq(ev.governor, gov1, "approving governor");
  ok(!r.events.some((e) => e.name === "KeyRotated"), "one approval does not rotate");
  r = await hub.send("governKey", [2n, 5n, key(k3), point(k3)], { from: gov1 });
  eq(r.events.length, 0, "a repeated approval counts once");
  r = await hub.send("governKey", [2n, 6n, key(k3), point(k3)], { from: gov2 });
  eq(r.events.find((e) => e.name === "GovernorApproved").approvals, 1n, "another epoch is another approval");
  eq(await hub.call("groupKey"), key(k2), "still k2");
  r = await hub.send("governKey", [2n, 5n, key(k3), point(k3)], { from: gov3 });
  ev = r.events.find((e) => e.name === "KeyRotated");
  eq(ev.governed, true, "KeyRotated governed");
  eq(ev.epoch, 5n, "governed epoch");
  eq(await hub.call("groupKey"), key(k3), "groupKey is k3");
  eq(await hub.call("lastRotation"), 2n, "lastRotation 2");
  const noGov = await deploy(artifact, ctorArgs({ govs: [], t: 0n, rot: 7n }), relay);
  eq(await noGov.call("lastRotation"), 7n, "a hub deployed at rotation 7");
  await noGov.reverts("governKey", [8n, 5n, key(k3), point(k3)], { from: gov1 }, "NotGovernor");
  await noGov.reverts("rotateKey", [7n, 1n, key(k2), point(k2), rs], {}, "RotationApplied");

  // -------------------------------------------------------------------
  section("gas (worst case: a new provider per call)");
  await hub.send("deposit", ["whale", "0x"], { from: relay, value: 1_000_000n * WPC });
  let nonce = 5n;
  let id = 1000n;
  const gas = {};
  for (const n of [1, 100, 400]) {
    const calls = [];
    for (let i = 0; i < n; i++) calls.push(call(++id, "whale", `provider-${nonce}-${i}`, 3));
    const sig = await signBatch(HUB, Number(nonce), calls, SK3);
    if (n === 100) {
      // Any gas limit below what the batch needs fails as LowGas, never
      // as a plain out-of-gas or a bad signature.
      const need = BigInt(await rpc("eth_estimateGas", [{ from: relay, to: hub.address, data: hub.data("submitBatch", [nonce, calls, sig]) }]));
      for (const g of [need / 3n, need / 2n, (need * 9n) / 10n, need - 100_000n, need - 1_000n, need - 1n]) {
        const [want, left] = await hub.reverts("submitBatch", [nonce, calls, sig], { from: relay, gas: g }, "LowGas");
        ok(left < want, `LowGas at a gas limit of ${g}`);
      }
      process.stdout.write(`   100 calls: estimate ${need}; every limit below it tried fails as LowGas\n`);
    }
    r = await hub.send("submitBatch", [nonce, calls, sig], { from: relay, gas: 16_000_000n });
    eq(r.status, "0x1", `batch of ${n} settles`);
    eq(await hub.call("payout", [`provider-${nonce}-${n - 1}`]), 3n, `last provider of ${n} paid`);
    gas[n] = r.gas;
    process.stdout.write(`   ${n} calls: ${r.gas} gas\n`);
    nonce++;
  }
  ok(gas[100] <= 3_300_000n, "100 calls within 3.3 M gas");
  ok(gas[400] <= 12_300_000n, "400 calls within 12.3 M gas");
  // And with a distinct user per call as well.
  const users = [];
  for (let i = 0; i < 100; i++) {
    users.push(`user-${i}`);
    await hub.send("deposit", [`user-${i}`, "0x"], { from: carolAddr, value: 10n * WPC });
  }
  {
    const calls = users.map((u, i) => call(++id, u, `fresh-${i}`, 2));
    const sig = await signBatch(HUB, Number(nonce), calls, SK3);
    r = await hub.send("submitBatch", [nonce, calls, sig], { from: relay, gas: 16_000_000n });
    eq(r.status, "0x1", "100 users to 100 new providers settle");
    process.stdout.write(`   100 calls, a new user and provider each: ${r.gas} gas\n`);
    nonce++;
  }

  process.stdout.write(`smoke: ${checks} checks passed\n`);
}

main()
  .then(async () => {
    await shutdown();
    process.exit(0);
  })
  .catch(async (e) => {
    process.stderr.write(`smoke: FAILED: ${e.stack || e}\n`);
    await shutdown();
    process.exit(1);
  });
