// The corpus pin: SHA-256 of the corpus's canonical serialisation — the corpus object without
// its `sha256` field, object keys sorted recursively (JavaScript's default sort, UTF-16 code
// units), serialised by JSON.stringify with no whitespace, encoded as UTF-8.
//
//   node pin.mjs            print the recomputed pin and whether it matches the stored one
//   node pin.mjs --write    store the recomputed pin in the corpus
//
// Exit status 1 when the stored pin does not match.

import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const CORPUS_PATH = fileURLToPath(new URL('../../corpus/split-profile/corpus.json', import.meta.url));

export function sortKeysDeep(value) {
  if (Array.isArray(value)) return value.map(sortKeysDeep);
  if (value !== null && typeof value === 'object') {
    const out = {};
    for (const key of Object.keys(value).sort()) out[key] = sortKeysDeep(value[key]);
    return out;
  }
  return value;
}

export function corpusPin(corpus) {
  const { sha256, ...rest } = corpus;
  void sha256;
  const canonical = JSON.stringify(sortKeysDeep(rest));
  return createHash('sha256').update(Buffer.from(canonical, 'utf8')).digest('hex');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const corpus = JSON.parse(readFileSync(CORPUS_PATH, 'utf8'));
  const pin = corpusPin(corpus);
  if (process.argv.includes('--write')) {
    corpus.sha256 = pin;
    writeFileSync(CORPUS_PATH, JSON.stringify(corpus, null, 1) + '\n');
    console.log(`pin written: ${pin}`);
  } else {
    const ok = corpus.sha256 === pin;
    console.log(`recomputed ${pin}\nstored     ${corpus.sha256}\n${ok ? 'MATCH' : 'MISMATCH'}`);
    process.exit(ok ? 0 : 1);
  }
}
