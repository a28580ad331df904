// A small Solidity ABI encoder/decoder for the smoke test, driven by the
// ABI JSON solc writes (types with `components` for tuples). Values:
// integers as BigInt (or number), bytes as "0x.." hex, strings as JS
// strings, addresses as "0x.." hex, tuples as arrays or objects.
"use strict";

const hex = (b) => Buffer.from(b).toString("hex");
const strip = (h) => (h.startsWith("0x") ? h.slice(2) : h);
const word = (n) => BigInt.asUintN(256, BigInt(n)).toString(16).padStart(64, "0");
const padRight = (h) => h + "0".repeat((64 - (h.length % 64)) % 64);

function typeString(t) {
  if (t.type.startsWith("tuple")) {
    return "(" + t.components.map(typeString).join(",") + ")" + t.type.slice(5);
  }
  return t.type;
}

function isDynamic(t) {
  if (t.type === "bytes" || t.type === "string" || t.type.endsWith("[]")) return true;
  if (t.type === "tuple") return t.components.some(isDynamic);
  return false;
}

function elementOf(t) {
  return { ...t, type: t.type.slice(0, -2) };
}

function encodeOne(t, v) {
  if (t.type.endsWith("[]")) {
    const et = elementOf(t);
    return word(v.length) + encodeSeq(v.map(() => et), v);
  }
  if (t.type === "tuple") {
    const vals = Array.isArray(v) ? v : t.components.map((c) => v[c.name]);
    return encodeSeq(t.components, vals);
  }
  if (t.type === "bytes" || t.type === "string") {
    // A string given as a Buffer is written byte for byte (not UTF-8).
    const data = t.type === "string" ? hex(Buffer.isBuffer(v) ? v : Buffer.from(v, "utf8")) : strip(v);
    return word(data.length / 2) + padRight(data);
  }
  if (t.type === "address") return strip(v).toLowerCase().padStart(64, "0");
  if (t.type === "bool") return word(v ? 1 : 0);
  if (t.type.startsWith("bytes")) return strip(v).padEnd(64, "0");
  if (t.type.startsWith("uint") || t.type.startsWith("int")) return word(v);
  throw new Error("abi: unsupported type " + t.type);
}

function encodeSeq(types, values) {
  if (types.length !== values.length) throw new Error("abi: arity mismatch");
  let head = "";
  let tail = "";
  const headLen = types.length * 32;
  for (let i = 0; i < types.length; i++) {
    const enc = encodeOne(types[i], values[i]);
    if (isDynamic(types[i])) {
      head += word(headLen + tail.length / 2);
      tail += enc;
    } else {
      head += enc;
    }
  }
  return head + tail;
}

function decodeOne(t, h, off) {
  // `off` is in bytes into h (hex without 0x); returns the value.
  const at = (o) => BigInt("0x" + h.slice(o * 2, o * 2 + 64));
  if (t.type.endsWith("[]")) {
    const p = Number(at(off));
    const n = Number(at(p));
    const et = elementOf(t);
    return decodeSeq(Array(n).fill(et), h.slice((p + 32) * 2));
  }
  if (t.type === "tuple") {
    if (isDynamic(t)) return decodeSeq(t.components, h.slice(Number(at(off)) * 2));
    return decodeSeq(t.components, h.slice(off * 2));
  }
  if (t.type === "bytes" || t.type === "string") {
    const p = Number(at(off));
    const n = Number(at(p));
    const data = h.slice((p + 32) * 2, (p + 32 + n) * 2);
    return t.type === "string" ? Buffer.from(data, "hex").toString("utf8") : "0x" + data;
  }
  if (t.type === "address") return "0x" + h.slice(off * 2 + 24, off * 2 + 64);
  if (t.type === "bool") return at(off) !== 0n;
  if (t.type.startsWith("bytes")) {
    const n = Number(t.type.slice(5));
    return "0x" + h.slice(off * 2, off * 2 + n * 2);
  }
  if (t.type.startsWith("uint")) return at(off);
  throw new Error("abi: unsupported type " + t.type);
}

function headSize(t) {
  if (isDynamic(t)) return 32;
  if (t.type === "tuple") return t.components.reduce((s, c) => s + headSize(c), 0);
  return 32;
}

function decodeSeq(types, h) {
  const out = [];
  let off = 0;
  for (const t of types) {
    out.push(decodeOne(t, h, off));
    off += headSize(t);
  }
  return out;
}

module.exports = {
  typeString,
  encode: (types, values) => encodeSeq(types, values),
  decode: (types, data) => decodeSeq(types, strip(data)),
  signature: (entry) => `${entry.name}(${entry.inputs.map(typeString).join(",")})`,
};
