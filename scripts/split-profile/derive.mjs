// Independent derivation of the split-profile corpus (criteria token-efficiency/v1, 1.2.0).
//
// This script shares no code with the Rust engine. It reads the criteria's rules as text and
// applies them with JavaScript's own JSON.parse / JSON.stringify and the reference tokenizer,
// gpt-tokenizer 4.0.0 (cl100k_base), called with empty allowed and disallowed special-token
// sets so that special-token spellings count as ordinary text. The derivability self-check is
// a brute-force enumeration of each whole's candidate box.
//
//   npm install && node derive.mjs      writes ../../corpus/split-profile/corpus.json (pinned)

import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { encode } from 'gpt-tokenizer/encoding/cl100k_base';
import cl100kRanks from 'gpt-tokenizer/bpeRanks/cl100k_base';
import { cases } from './cases.mjs';
import { CORPUS_PATH, corpusPin } from './pin.mjs';

const PINNED_DATA_SHA256 = '223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7';
const MAX_TOOLS = 200;
const MAX_BODY_BYTES = 262144;

// ---- the reference tokenizer, verified ------------------------------------------------------

const require = createRequire(import.meta.url);
const pkg = require('gpt-tokenizer/package.json');
if (pkg.version !== '4.0.0') throw new Error(`gpt-tokenizer ${pkg.version}, expected 4.0.0`);
const dataFile = require.resolve('gpt-tokenizer/data/cl100k_base.tiktoken');
const dataSha = createHash('sha256').update(readFileSync(dataFile)).digest('hex');
if (dataSha !== PINNED_DATA_SHA256) throw new Error(`data file sha256 ${dataSha}`);
// The ranks the encoder actually uses (its bundled JS module), in .tiktoken line form.
{
  const enc = new TextEncoder();
  const h = createHash('sha256');
  cl100kRanks.forEach((v, rank) => {
    const bytes = typeof v === 'string' ? enc.encode(v) : Uint8Array.from(v);
    h.update(`${Buffer.from(bytes).toString('base64')} ${rank}\n`);
  });
  const ranksSha = h.digest('hex');
  if (ranksSha !== PINNED_DATA_SHA256) throw new Error(`encoder ranks sha256 ${ranksSha}`);
}

const NO_SPECIAL = { allowedSpecial: new Set(), disallowedSpecial: new Set() };
const countTokens = (text) => (text.length === 0 ? 0 : encode(text, NO_SPECIAL).length);
if (countTokens('<|endoftext|>') <= 1) throw new Error('special spellings must be ordinary text');

// ---- the derivability self-check, by enumeration ----------------------------------------------

// β: the measured minimum byte length of a part holding d tokens (attacker model v2).
function beta(kind, d) {
  if (kind === 'string' && d === 1) return 2;
  if (kind === 'string' && d === 2) return 3;
  return d;
}
const KINDS = ['string', 'string', 'schema'];

// The candidate counts of one part: absent → [0]; present → every d ≥ 1 with β(d) ≤ bytes.
// `limit` keeps only the smallest `limit` candidates (see clipping below).
function partCandidates(kind, present, bytes, limit = Infinity) {
  if (!present) return [0];
  const out = [];
  for (let d = 1; d <= bytes && out.length < limit; d++) if (beta(kind, d) <= bytes) out.push(d);
  return out;
}

// Floored shares, decided on unrounded values: the largest multiple of 0.5 ≤ x/t.
function floorShare(x, t) {
  if (x === t) return 1;
  if (2 * x >= t) return 0.5;
  return 0;
}
const shareKey = (x) => {
  const t = x[0] + x[1] + x[2];
  return x.map((v) => floorShare(v, t)).join('/');
};

// The withholding class of the box given by per-part candidate lists (enumerated, lex order).
function withholdingClass(lists) {
  const all = [];
  for (const a of lists[0]) for (const b of lists[1]) for (const c of lists[2]) all.push([a, b, c]);
  const byClass = new Map();
  for (const x of all) {
    const k = shareKey(x);
    byClass.set(k, (byClass.get(k) ?? 0) + 1);
  }
  const unique = all.filter((x) => byClass.get(shareKey(x)) === 1);
  const classes = new Set(unique.map(shareKey));
  if (unique.length === 1 && all.length > 1) {
    const u = unique[0];
    const y = all.find((x) => !(x[0] === u[0] && x[1] === u[1] && x[2] === u[2]));
    classes.add(shareKey(y));
  }
  return { size: all.length, classes };
}

// Boxes too large to enumerate are enumerated over each part's smallest CLIP candidates.
// Justification (checked below by enumeration for every box up to 16 bytes a part): whether
// a share class holds 0, 1 or ≥ 2 candidates, and which candidate when it holds one, depends
// on each present part's largest candidate M only through min(M, 3), because classes are
// cut by the inequalities x_i < x_j + x_k, x_i ≥ x_j + x_k and x_i = x_j between parts that
// all start at 1; the lexicographically smallest candidates are kept by the clip as well.
const CLIP = 8;
const ENUMERATE_LIMIT = 2_000_000;

function selfCheckWithheld(present, bytes, truth) {
  const full = KINDS.map((k, i) => partCandidates(k, present[i], bytes[i], CLIP + 1));
  const inBox = truth.every((d, i) =>
    present[i] ? d >= 1 && d <= bytes[i] && beta(KINDS[i], d) <= bytes[i] : d === 0,
  );
  if (!inBox) throw new Error('true counts outside their own candidate box');
  const sizes = KINDS.map((k, i) => (present[i] ? partCandidates(k, true, bytes[i]).length : 1));
  const enumerable = sizes[0] * sizes[1] * sizes[2] <= ENUMERATE_LIMIT;
  const lists = enumerable
    ? KINDS.map((k, i) => partCandidates(k, present[i], bytes[i]))
    : full.map((l) => l.slice(0, CLIP));
  const { size, classes } = withholdingClass(lists);
  if (size === 1) return { withheld: true, enumerated: enumerable };
  return { withheld: classes.has(shareKey(truth)), enumerated: enumerable };
}

// Check the clip against full enumeration on every box up to 16 bytes a part.
{
  let boxes = 0;
  const lengths = (kind) => [[false, 0], ...Array.from({ length: 16 }, (_, i) => [true, i + 1]).filter(([, l]) => kind === 'schema' || l >= 2)];
  for (const [pa, la] of lengths('string'))
    for (const [pb, lb] of lengths('string'))
      for (const [pc, lc] of lengths('schema')) {
        if (!pa && !pb && !pc) continue;
        const present = [pa, pb, pc];
        const bytes = [la, lb, lc];
        const full = KINDS.map((k, i) => partCandidates(k, present[i], bytes[i]));
        const clipped = full.map((l) => l.slice(0, CLIP));
        const F = withholdingClass(full);
        const C = withholdingClass(clipped);
        for (const a of full[0]) for (const b of full[1]) for (const c of full[2]) {
          const k = shareKey([a, b, c]);
          const fw = F.size === 1 || F.classes.has(k);
          const cw = C.size === 1 || C.classes.has(k);
          if (fw !== cw) throw new Error(`clip disagrees at ${present} ${bytes} [${a},${b},${c}]`);
        }
        boxes++;
      }
  console.error(`clip check: ${boxes} boxes agree`);
}

// ---- the criteria's input contract and serialisation rule -------------------------------------

const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const isPlainObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

function bodyBytes(c) {
  if (c.input_base64 !== undefined) return Buffer.from(c.input_base64, 'base64');
  const text = Buffer.from(c.input, 'utf8');
  if (c.pad_to_bytes === undefined) return text;
  if (text.length > c.pad_to_bytes) throw new Error(`${c.id}: input longer than pad_to_bytes`);
  return Buffer.concat([text, Buffer.alloc(c.pad_to_bytes - text.length, 0x20)]);
}

function refuse(rule) {
  return { refusal: rule };
}

function derive(bytes) {
  if (bytes.length > MAX_BODY_BYTES) return { expected: refuse('body_over_cap') };
  let value;
  try {
    const text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
    value = JSON.parse(text);
  } catch {
    return { expected: refuse('not_json') };
  }
  // The { catalogue, caller? } envelope, or a bare catalogue.
  const catalogue = isPlainObject(value) && hasOwn(value, 'catalogue') ? value.catalogue : value;
  let entries;
  if (Array.isArray(catalogue)) entries = catalogue;
  else if (isPlainObject(catalogue) && hasOwn(catalogue, 'tools') && Array.isArray(catalogue.tools)) entries = catalogue.tools;
  else return { expected: refuse('malformed_catalogue') };
  if (entries.length === 0) return { expected: refuse('zero_tools') };
  if (entries.length > MAX_TOOLS) return { expected: refuse('over_tool_cap') };
  for (const e of entries) {
    if (!isPlainObject(e)) return { expected: refuse('malformed_tool_entry') };
    if (hasOwn(e, 'name') && typeof e.name !== 'string') return { expected: refuse('malformed_name') };
    if (hasOwn(e, 'description') && typeof e.description !== 'string') return { expected: refuse('malformed_description') };
  }

  // Part strings, counts (each part encoded separately) and byte lengths.
  const tools = entries.map((e) => {
    const parts = [
      hasOwn(e, 'name') ? JSON.stringify(e.name) : null,
      hasOwn(e, 'description') ? JSON.stringify(e.description) : null,
      hasOwn(e, 'inputSchema') ? JSON.stringify(e.inputSchema) : null,
    ];
    return {
      name: hasOwn(e, 'name') ? e.name : null,
      parts,
      present: parts.map((p) => p !== null),
      counts: parts.map((p) => (p === null ? 0 : countTokens(p))),
      bytes: parts.map((p) => (p === null ? 0 : Buffer.byteLength(p, 'utf8'))),
    };
  });

  let enumeratedAll = true;
  function shares(counts, bytes, present, emptyReason) {
    const total = counts[0] + counts[1] + counts[2];
    const nulls = (reason) => ({ name_share: null, description_share: null, schema_share: null, reason });
    if (total === 0) return nulls(emptyReason);
    const check = selfCheckWithheld(present, bytes, counts);
    enumeratedAll &&= check.enumerated;
    if (check.withheld) return nulls('shares_withheld');
    return {
      name_share: floorShare(counts[0], total),
      description_share: floorShare(counts[1], total),
      schema_share: floorShare(counts[2], total),
    };
  }

  const rows = tools.map((t, index) => ({ index, name: t.name, ...shares(t.counts, t.bytes, t.present, 'empty_definition') }));
  const sum = (f) => [0, 1, 2].map((i) => tools.reduce((acc, t) => acc + f(t)[i], 0));
  const catCounts = sum((t) => t.counts);
  const catBytes = sum((t) => t.bytes);
  const catPresent = [0, 1, 2].map((i) => tools.some((t) => t.present[i]));
  const r1 = shares(catCounts, catBytes, catPresent, 'empty_catalogue');

  const bySchema = new Map();
  tools.forEach((t, i) => {
    if (t.parts[2] === null) return;
    if (!bySchema.has(t.parts[2])) bySchema.set(t.parts[2], []);
    bySchema.get(t.parts[2]).push(i);
  });
  const groups = [...bySchema.values()]
    .filter((ix) => ix.length >= 2)
    .map((indices, group) => ({ group, names: indices.map((i) => tools[i].name), indices, tools: indices.length }));

  return {
    expected: {
      tools: tools.length,
      'R-1': r1,
      'R-2': rows,
      'R-3': { group_count: groups.length, groups },
      precheck_r3: tools.filter((t) => t.present[2]).length >= 2 ? 'ASSESSABLE' : 'NOT-ASSESSABLE',
    },
    figures: {
      part_tokens: tools.map((t) => t.counts.map((c, i) => (t.present[i] ? c : null))),
      part_bytes: tools.map((t) => t.bytes.map((b, i) => (t.present[i] ? b : null))),
      self_check: enumeratedAll ? 'enumerated' : 'enumerated-clipped',
    },
  };
}

// ---- write the corpus ------------------------------------------------------------------------

const ids = new Set();
const out = [];
for (const c of cases) {
  if (ids.has(c.id)) throw new Error(`duplicate id ${c.id}`);
  ids.add(c.id);
  const { expected, figures } = derive(bodyBytes(c));
  const entry = { id: c.id, note: c.note };
  for (const k of ['input', 'input_base64', 'pad_to_bytes', 'same_report_as']) if (c[k] !== undefined) entry[k] = c[k];
  entry.expected = expected;
  if (figures) entry.figures = figures;
  out.push(entry);
}
for (const c of out) {
  if (c.same_report_as) {
    const other = out.find((o) => o.id === c.same_report_as);
    if (JSON.stringify(other.expected) !== JSON.stringify(c.expected)) throw new Error(`${c.id} differs from ${c.same_report_as}`);
  }
}

const corpus = {
  id: 'tokensaver-split-profile-corpus/v1',
  criteria: { criteria_id: 'token-efficiency/v1', criteria_revision: '1.2.0', op: 'split-profile' },
  reference: {
    tokenizer: 'cl100k_base',
    package: `gpt-tokenizer@${pkg.version}`,
    data_sha256: dataSha,
    encoder_ranks_sha256: PINNED_DATA_SHA256,
    special_tokens: 'encode(text, { allowedSpecial: new Set(), disallowedSpecial: new Set() }): special-token spellings count as ordinary text',
    json: `JSON.parse / JSON.stringify of Node.js ${process.version}`,
  },
  derivation: 'scripts/split-profile/derive.mjs (independent of the engine); pin: scripts/split-profile/pin.mjs',
  fields: {
    input: 'the request body as UTF-8 text; with pad_to_bytes, followed by spaces up to that many bytes; input_base64: raw body bytes',
    expected: 'refusal: the rule id; otherwise tools, R-1, R-2, R-3 as the report carries them, and precheck_r3',
    figures: 'derivation figures for checking agreement (never a surface of the op): per tool, the token count and UTF-8 byte length of each part (null = absent); self_check says whether every candidate box was fully enumerated',
  },
  cases: out,
};
corpus.sha256 = corpusPin(corpus);
writeFileSync(CORPUS_PATH, JSON.stringify(corpus, null, 1) + '\n');
const refusals = out.filter((c) => c.expected.refusal).length;
console.log(`${out.length} cases (${out.length - refusals} reports, ${refusals} refusals) → ${CORPUS_PATH}\npin ${corpus.sha256}`);
