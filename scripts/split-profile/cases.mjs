// The split-profile corpus inputs. Each case is a request body exactly as submitted:
//   { id, note, input }                 input is the body text (UTF-8)
//   { id, note, input, pad_to_bytes }   the body text followed by spaces up to pad_to_bytes
//   { id, note, input_base64 }          raw body bytes (for inputs that are not UTF-8)
// Expected values are NOT written here: derive.mjs derives them from the criteria text with
// Node's own JSON.parse/JSON.stringify and gpt-tokenizer.

const j = (v) => JSON.stringify(v);

// ---- realistic MCP catalogues -------------------------------------------------------------

const pathSchema = {
  type: 'object',
  properties: { path: { type: 'string' } },
  required: ['path'],
  additionalProperties: false,
  $schema: 'http://json-schema.org/draft-07/schema#',
};

const filesystemTools = [
  {
    name: 'read_file',
    title: 'Read file',
    description:
      'Read the complete contents of a file from the file system. Handles various text encodings and provides detailed error messages if the file cannot be read. Use this tool when you need to examine the contents of a single file. Only works within allowed directories.',
    inputSchema: pathSchema,
    annotations: { readOnlyHint: true, openWorldHint: false },
  },
  {
    name: 'read_multiple_files',
    title: 'Read multiple files',
    description:
      "Read the contents of multiple files simultaneously. This is more efficient than reading files one by one when you need to analyze or compare multiple files. Each file's content is returned with its path as a reference. Failed reads for individual files won't stop the entire operation. Only works within allowed directories.",
    inputSchema: {
      type: 'object',
      properties: { paths: { type: 'array', items: { type: 'string' } } },
      required: ['paths'],
      additionalProperties: false,
      $schema: 'http://json-schema.org/draft-07/schema#',
    },
    annotations: { readOnlyHint: true },
  },
  {
    name: 'write_file',
    description:
      'Create a new file or completely overwrite an existing file with new content. Use with caution as it will overwrite existing files without warning. Handles text content with proper encoding. Only works within allowed directories.',
    inputSchema: {
      type: 'object',
      properties: { path: { type: 'string' }, content: { type: 'string' } },
      required: ['path', 'content'],
      additionalProperties: false,
      $schema: 'http://json-schema.org/draft-07/schema#',
    },
    annotations: { destructiveHint: true, idempotentHint: true },
  },
  {
    name: 'edit_file',
    description:
      'Make line-based edits to a text file. Each edit replaces exact line sequences with new content. Returns a git-style diff showing the changes made. Only works within allowed directories.',
    inputSchema: {
      type: 'object',
      properties: {
        path: { type: 'string' },
        edits: {
          type: 'array',
          items: {
            type: 'object',
            properties: {
              oldText: { type: 'string', description: 'Text to search for - must match exactly' },
              newText: { type: 'string', description: 'Text to replace with' },
            },
            required: ['oldText', 'newText'],
            additionalProperties: false,
          },
        },
        dryRun: { type: 'boolean', default: false, description: 'Preview changes using git-style diff format' },
      },
      required: ['path', 'edits'],
      additionalProperties: false,
      $schema: 'http://json-schema.org/draft-07/schema#',
    },
  },
  {
    name: 'create_directory',
    description:
      'Create a new directory or ensure a directory exists. Can create multiple nested directories in one operation. If the directory already exists, this operation will succeed silently. Perfect for setting up directory structures for projects or ensuring required paths exist. Only works within allowed directories.',
    inputSchema: pathSchema,
  },
  {
    name: 'list_directory',
    description:
      'Get a detailed listing of all files and directories in a specified path. Results clearly distinguish between files and directories with [FILE] and [DIR] prefixes. This tool is essential for understanding directory structure and finding specific files within a directory. Only works within allowed directories.',
    inputSchema: pathSchema,
    outputSchema: { type: 'object', properties: { entries: { type: 'array' } } },
  },
  {
    name: 'move_file',
    description:
      'Move or rename files and directories. Can move files between directories and rename them in a single operation. If the destination exists, the operation will fail. Works across different directories and can be used for simple renaming within the same directory. Both source and destination must be within allowed directories.',
    inputSchema: {
      type: 'object',
      properties: { source: { type: 'string' }, destination: { type: 'string' } },
      required: ['source', 'destination'],
      additionalProperties: false,
      $schema: 'http://json-schema.org/draft-07/schema#',
    },
  },
  {
    name: 'search_files',
    description:
      "Recursively search for files and directories matching a pattern. Searches through all subdirectories from the starting path. The search is case-insensitive and matches partial names. Returns full paths to all matching items. Great for finding files when you don't know their exact location. Only searches within allowed directories.",
    inputSchema: {
      type: 'object',
      properties: {
        path: { type: 'string' },
        pattern: { type: 'string' },
        excludePatterns: { type: 'array', items: { type: 'string' }, default: [] },
      },
      required: ['path', 'pattern'],
      additionalProperties: false,
      $schema: 'http://json-schema.org/draft-07/schema#',
    },
  },
  {
    name: 'get_file_info',
    description:
      'Retrieve detailed metadata about a file or directory. Returns comprehensive information including size, creation time, last modified time, permissions, and type. This tool is perfect for understanding file characteristics without reading the actual content. Only works within allowed directories.',
    inputSchema: pathSchema,
    _meta: { 'io.example/ui': { icon: 'info' } },
  },
  {
    name: 'list_allowed_directories',
    description:
      'Returns the list of directories that this server is allowed to access. Use this to understand which directories are available before trying to access files.',
    inputSchema: { type: 'object', properties: {}, required: [] },
  },
];

const githubTools = [
  {
    name: 'create_issue',
    description: 'Create a new issue in a GitHub repository',
    inputSchema: {
      type: 'object',
      properties: {
        owner: { type: 'string', description: 'Repository owner' },
        repo: { type: 'string', description: 'Repository name' },
        title: { type: 'string', description: 'Issue title' },
        body: { type: 'string', description: 'Issue body content' },
        labels: { type: 'array', items: { type: 'string' }, description: 'Labels to apply' },
      },
      required: ['owner', 'repo', 'title'],
    },
  },
  {
    name: 'get_issue',
    description: 'Get details of a specific issue in a GitHub repository.',
    inputSchema: {
      type: 'object',
      properties: {
        owner: { type: 'string', description: 'The owner of the repository' },
        repo: { type: 'string', description: 'The name of the repository' },
        issue_number: { type: 'number', description: 'The number of the issue' },
      },
      required: ['owner', 'repo', 'issue_number'],
    },
  },
  {
    name: 'get_pull_request',
    description: 'Get details of a specific pull request',
    inputSchema: {
      type: 'object',
      properties: {
        owner: { type: 'string', description: 'The owner of the repository' },
        repo: { type: 'string', description: 'The name of the repository' },
        issue_number: { type: 'number', description: 'The number of the issue' },
      },
      required: ['owner', 'repo', 'issue_number'],
    },
  },
  {
    name: 'search_repositories',
    description: 'Search for GitHub repositories',
    inputSchema: {
      type: 'object',
      properties: {
        query: { type: 'string', description: 'Search query (see GitHub search syntax)' },
        page: { type: 'number', description: 'Page number for pagination (default: 1)' },
        perPage: { type: 'number', description: 'Number of results per page (default: 30, max: 100)' },
      },
      required: ['query'],
    },
  },
  {
    name: 'get_file_contents',
    description: 'Get the contents of a file or directory from a GitHub repository',
    inputSchema: {
      type: 'object',
      properties: {
        owner: { type: 'string', description: 'Repository owner (username or organization)' },
        repo: { type: 'string', description: 'Repository name' },
        path: { type: 'string', description: 'Path to the file or directory' },
        branch: { type: 'string', description: 'Branch to get contents from' },
      },
      required: ['owner', 'repo', 'path'],
    },
  },
  {
    name: 'list_commits',
    description: 'Get list of commits of a branch in a GitHub repository',
    inputSchema: {
      type: 'object',
      properties: {
        owner: { type: 'string' },
        repo: { type: 'string' },
        sha: { type: 'string' },
        page: { type: 'number' },
        perPage: { type: 'number' },
      },
      required: ['owner', 'repo'],
    },
  },
];

// ---- a deterministic generator for large catalogues ---------------------------------------

function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 4294967296;
  };
}

const WORDS = (
  'account address amount archive attachment audit backup balance batch billing branch bucket ' +
  'cache calendar campaign channel checkout cluster comment commit config contact container ' +
  'contract customer dashboard database dataset deployment device document domain draft email ' +
  'endpoint environment event export feature file folder form gateway group incident index ' +
  'invoice issue job key label ledger license log message metric model monitor note notification ' +
  'order organization package page payment permission pipeline plan policy project queue quota ' +
  'record region release report repository request resource role schedule schema secret segment ' +
  'server service session snapshot subscription table tag task team template ticket token topic ' +
  'transaction user vault version volume webhook workflow workspace zone'
).split(' ');
const VERBS = 'get list create update delete search export import archive restore sync validate'.split(' ');
const TYPES = ['string', 'number', 'integer', 'boolean'];
const SENTENCES = [
  'Returns the matching items ordered by creation time, newest first.',
  'Requires the caller to hold the appropriate permission on the parent resource.',
  'Use the cursor from a previous response to fetch the next page of results.',
  'Fails with a not-found error when the identifier does not exist.',
  'All timestamps are ISO 8601 strings in UTC.',
  'The operation is idempotent: repeating it with the same arguments has no further effect.',
  'Large results are truncated; narrow the query with filters to see everything.',
  'Deleted items stay recoverable for thirty days before they are purged.',
  'Rate limits apply per workspace; on a limit the call returns a retry hint.',
  'Fields not listed in the schema are ignored.',
];

function pick(r, list) {
  return list[Math.floor(r() * list.length)];
}

function generatedTool(r, i, sentences, props) {
  const noun = pick(r, WORDS);
  const verb = pick(r, VERBS);
  const properties = {};
  const required = [];
  for (let p = 0; p < props; p++) {
    const key = `${pick(r, WORDS)}_${p}`;
    const type = pick(r, TYPES);
    properties[key] = {
      type,
      description: `The ${pick(r, WORDS)} ${pick(r, WORDS)} to use for this ${noun}.`,
    };
    if (type === 'string' && r() < 0.3) properties[key].enum = [pick(r, WORDS), pick(r, WORDS), pick(r, WORDS)];
    if (r() < 0.5) required.push(key);
  }
  let description = `${verb[0].toUpperCase()}${verb.slice(1)} a ${noun} in the workspace.`;
  for (let s = 0; s < sentences; s++) description += ' ' + pick(r, SENTENCES);
  return {
    name: `${verb}_${noun}_${i}`,
    title: `${verb} ${noun}`,
    description,
    inputSchema: { type: 'object', properties, required },
    annotations: { readOnlyHint: verb === 'get' || verb === 'list' || verb === 'search' },
  };
}

function generatedCatalogue(seed, count, sentences, props, shared) {
  const r = rng(seed);
  const tools = [];
  for (let i = 0; i < count; i++) {
    const t = generatedTool(r, i, sentences, props);
    if (shared && i % 17 === 5) t.inputSchema = { type: 'object', properties: {}, required: [] };
    if (shared && i % 23 === 7) t.inputSchema = pathSchema;
    tools.push(t);
  }
  return tools;
}

/// The largest generated catalogue of 200 tools that fits under the body cap.
function maxSizeCatalogue() {
  let best = null;
  for (let sentences = 1; sentences < 40; sentences++) {
    const text = j({ tools: generatedCatalogue(7, 200, sentences, 5, true), nextCursor: null });
    if (Buffer.byteLength(text) > 262144) break;
    best = text;
  }
  return best;
}

/// Tools whose descriptions put sampled code points into several tokenizer contexts.
function unicodeSweep() {
  const spaces = [0x09, 0x0b, 0x0c, 0x20, 0x85, 0xa0, 0x1680, 0x180e, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x200b, 0x2028, 0x2029, 0x202f, 0x205f, 0x2060, 0x3000, 0xfeff];
  const sample = [...spaces];
  for (let cp = 0x21; cp < 0x110000; cp += 257) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    sample.push(cp);
  }
  const tools = [];
  for (let i = 0; i < sample.length; i += 24) {
    const chunk = sample.slice(i, i + 24).map((cp) => String.fromCodePoint(cp));
    tools.push({
      name: `sweep_${tools.length}`,
      description: chunk.map((c) => `a${c}b 1${c}2 ${c}${c}x '${c}t`).join(' '),
      inputSchema: { type: 'object', properties: Object.fromEntries(chunk.slice(0, 4).map((c, k) => [`k${c}${k}`, { type: 'string' }])) },
    });
  }
  return tools.slice(0, 190);
}

// ---- the cases -------------------------------------------------------------------------

const deep = (n) => '['.repeat(n) + ']'.repeat(n);

export const cases = [
  // realistic catalogues
  {
    id: 'mcp-filesystem-tools-list',
    note: 'a tools/list result of a filesystem MCP server: title, annotations, outputSchema, _meta and nextCursor are ignored; five tools share one path schema',
    input: j({ tools: filesystemTools, nextCursor: 'eyJwYWdlIjoyfQ==' }),
  },
  {
    id: 'mcp-github-array',
    note: 'a bare array of GitHub MCP tools; two tools carry byte-identical schemas',
    input: j(githubTools),
  },
  {
    id: 'mcp-github-pretty-printed',
    note: 'the same catalogue pretty-printed: whitespace between tokens of the submission changes no part string',
    input: JSON.stringify(githubTools, null, 2),
  },
  {
    id: 'envelope-with-caller',
    note: 'the { catalogue, caller } request body; caller is read only by the free pre-check',
    input: j({ caller: 'wallet-7f3a', catalogue: { tools: githubTools } }),
  },
  {
    id: 'envelope-with-ignored-inputs',
    note: 'sessions_per_day, daily_ceiling_tokens and calls_per_day are ignored entirely: the report equals mcp-github-array',
    input: j({ catalogue: githubTools, sessions_per_day: 40, daily_ceiling_tokens: 250000, calls_per_day: 12 }),
    same_report_as: 'mcp-github-array',
  },
  {
    id: 'wrapper-ignored-inputs-beside-tools',
    note: 'ignored inputs beside tools in a bare wrapper object are ignored too',
    input: j({ tools: githubTools, nextCursor: null, sessions_per_day: 3, calls_per_day: 1 }),
    same_report_as: 'mcp-github-array',
  },
  // text content
  {
    id: 'unicode-cjk-and-accents',
    note: 'CJK, Cyrillic, accented Latin and right-to-left text in names and descriptions',
    input: j([
      { name: '検索', description: 'ドキュメントを検索します。結果は関連度順に並びます。', inputSchema: { type: 'object', properties: { クエリ: { type: 'string' } } } },
      { name: 'créer_événement', description: 'Crée un événement dans le calendrier de l’équipe, à l’heure indiquée.' },
      { name: 'поиск', description: 'Найти документы по ключевым словам.', inputSchema: { type: 'object' } },
      { name: 'بحث', description: 'ابحث في المستندات', inputSchema: { type: 'object' } },
    ]),
  },
  {
    id: 'emoji-and-zwj',
    note: 'emoji, skin tones, ZWJ sequences and flags',
    input: j([
      { name: 'party_🎉', description: '🎉🎉🎉 Celebrate! 👩🏽‍💻 works with 👨‍👩‍👧‍👦 and 🇫🇷 flags.', inputSchema: { type: 'object', properties: { mood: { type: 'string', enum: ['😀', '😢', '🤖'] } } } },
      { name: '🚀', description: '🚀' },
      { name: 'weather', description: 'Forecast ☀️🌧️⛈️ for a city.', inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
    ]),
  },
  {
    id: 'special-token-spellings',
    note: 'special-token spellings are counted as ordinary text (empty allowed-special set)',
    input: j([
      { name: '<|endoftext|>', description: 'Ends with <|endoftext|> and starts with <|im_start|>system', inputSchema: { '<|fim_prefix|>': '<|fim_middle|>', note: '<|endofprompt|><|im_end|><|im_sep|>' } },
      { name: 'im_start', description: '<|im_start|>user\nhello<|im_end|>', inputSchema: '<|endoftext|>' },
      { name: 'plain', description: 'no special spellings here' },
    ]),
  },
  {
    id: 'bom-and-nel-in-text',
    note: 'U+FEFF and U+0085 inside parts: JavaScript\'s \\s holds U+FEFF and not U+0085, and gpt-tokenizer looks merge candidates up through a TextDecoder that drops a leading U+FEFF',
    input: j([
      { name: '\ufeffread_file', description: '\ufeffReads a file.\u0085Second line\u0085\u0085! and\ufeffjoined \ufeff\ufeff words', inputSchema: { '\ufeffkey': 'x\ufeffy', n: '1\ufeff2' } },
      { name: 'nel', description: ' \u0085a \u0085! \u0085\u0085 end \u0085\'s \u0085' },
      { name: '\ufeff', description: '\ufeff', inputSchema: '\ufeff' },
    ]),
  },
  {
    id: 'unicode-sweep',
    note: 'a sample of code points from every plane, each in letter, number, whitespace and contraction contexts, plus every whitespace character: part counts must agree exactly',
    input: j(unicodeSweep()),
  },
  {
    id: 'string-escapes',
    note: 'escapes are decoded then re-serialised by JSON.stringify: \\/ becomes /, \\u0041 becomes A, control characters stay escaped, U+2028 is literal',
    input: '[{"name":"esc\\/aped\\u0041","description":"line1\\nline2\\ttab\\u0000nul\\u001fus\\u007fdel \\u2028 \\"quoted\\" back\\\\slash \\b\\f\\r","inputSchema":{"pattern":"^\\\\d+$","sep":"\\u000b"}}]',
  },
  {
    id: 'lone-surrogates',
    note: 'lone surrogates survive JSON.parse and are re-escaped by well-formed JSON.stringify; a valid pair written as escapes becomes the literal emoji',
    input: '[{"name":"lone\\ud800","description":"\\udfff trailing and \\ud83d\\ude00 paired","inputSchema":{"k\\udbff":"\\udc00v"}},{"name":"\\ude00\\ud83d","inputSchema":{"k\\udbff":"\\udc00v"}}]',
  },
  {
    id: 'long-description',
    note: 'one tool with a long prose description and a small schema',
    input: j([{ name: 'analyze_logs', description: Array.from({ length: 40 }, (_, i) => SENTENCES[i % SENTENCES.length]).join(' '), inputSchema: { type: 'object', properties: { since: { type: 'string' } } } }]),
  },
  // absent and empty fields
  {
    id: 'absent-fields-mixed',
    note: 'tools with only a name, only a description, only a schema; a missing field is a zero sub-count and a 0 share, never null',
    input: j([
      { name: 'only_a_name_for_this_tool' },
      { description: 'Only a description, with a few more words in it.' },
      { inputSchema: { type: 'object', properties: { q: { type: 'string' } } } },
      { name: 'full', description: 'Name, description and schema.', inputSchema: { type: 'object' } },
    ]),
  },
  {
    id: 'empty-strings',
    note: 'name "" and description "" are present (part `""`), not absent',
    input: j([
      { name: '', description: '', inputSchema: { type: 'object', properties: { a: { type: 'string' } } } },
      { name: 'has_name', description: '' },
    ]),
  },
  {
    id: 'all-absent-tools',
    note: 'every tool has total 0: each row empty_definition, the catalogue empty_catalogue; extra fields do not count',
    input: j([{}, { title: 'Only a title', annotations: { readOnlyHint: true } }, { outputSchema: { type: 'object' }, _meta: {} }]),
  },
  {
    id: 'one-empty-tool-among-others',
    note: 'one tool with total 0 among counted tools: that row empty_definition, the catalogue published',
    input: j([
      { name: 'list_projects', description: 'List every project the caller can see, newest first.', inputSchema: { type: 'object', properties: { cursor: { type: 'string' } } } },
      { title: 'placeholder' },
      { name: 'get_project', description: 'Get one project by its identifier.', inputSchema: { type: 'object', properties: { id: { type: 'string' } }, required: ['id'] } },
    ]),
  },
  // schemas of every JSON type
  {
    id: 'schema-null-and-scalars',
    note: 'inputSchema null is present with part null; booleans, numbers and strings are schemas too',
    input: '[{"name":"n","inputSchema":null},{"name":"t","inputSchema":true},{"name":"f","inputSchema":false},{"name":"z","inputSchema":0},{"name":"pi","inputSchema":3.14159},{"name":"s","inputSchema":"object"},{"name":"e","inputSchema":""}]',
  },
  {
    id: 'schema-negative-integers',
    note: 'negative-integer schemas (β_schema(2)=2): with an empty name the tool box is {1}×{1,2} and [1,0,2] is box-unique — withheld',
    input: '[{"name":"","inputSchema":-5},{"name":"","inputSchema":-7},{"name":"neg","description":"A tool whose schema is a negative integer.","inputSchema":-123456}]',
  },
  {
    id: 'schema-arrays-and-deep-nesting',
    note: 'array schemas, including 300 levels of nesting',
    input: `[{"name":"arr","inputSchema":[]},{"name":"arr3","inputSchema":[1,2,3]},{"name":"nested","inputSchema":[[[]]]},{"name":"deep","description":"deeply nested","inputSchema":${deep(300)}}]`,
  },
  // identity groups
  {
    id: 'key-order-differs-no-group',
    note: 'schemas that differ only in key order are not identical (submitted-order serialisation)',
    input: '[{"name":"a","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}},{"name":"b","inputSchema":{"properties":{"x":{"type":"string"}},"type":"object"}}]',
  },
  {
    id: 'identical-empty-schemas',
    note: '{} == {} groups; absent schemas never group',
    input: '[{"name":"a","inputSchema":{}},{"name":"b"},{"name":"c","inputSchema":{}},{"name":"d"},{"name":"e","inputSchema":{}}]',
  },
  {
    id: 'groups-with-unnamed-members',
    note: 'two groups; a group member without a name is listed with name null',
    input: j([
      { name: 'first', inputSchema: { type: 'object', properties: { id: { type: 'string' } } } },
      { description: 'unnamed, same schema as first', inputSchema: { type: 'object', properties: { id: { type: 'string' } } } },
      { name: 'third', inputSchema: { type: 'string' } },
      { name: 'fourth', inputSchema: { type: 'string' } },
      { name: 'fifth', inputSchema: { type: 'object', properties: { id: { type: 'number' } } } },
    ]),
  },
  {
    id: 'whitespace-inside-schema-does-not-matter',
    note: 'schemas written with different whitespace serialise identically and group',
    input: '[{"name":"a","inputSchema":{"type":"object","required":["x"]}},{"name":"b","inputSchema":{ "type" : "object" ,\n "required" : [ "x" ] }}]',
  },
  {
    id: 'integer-like-keys-order',
    note: 'JavaScript key order: integer-like keys first ascending, then the rest in insertion order; schemas differing only in integer-key order therefore group',
    input: '[{"name":"a","inputSchema":{"b":1,"10":2,"2":3,"a":4,"01":5,"-1":6,"4294967295":7,"4294967294":8}},{"name":"b","inputSchema":{"1":"x","0":"y"}},{"name":"c","inputSchema":{"0":"y","1":"x"}}]',
  },
  // JavaScript number formatting and duplicate keys
  {
    id: 'js-number-formatting',
    note: 'numbers print as JavaScript prints them: 1.0→1, 1e2→100, 1e21→1e+21, 1e-7→1e-7, 1e400→null, -0→0, big integers rounded to doubles',
    input: '[{"name":"nums","inputSchema":{"one":1.0,"hundred":1e2,"e21":1e21,"e20":1e20,"tiny":1e-7,"small":0.000001,"inf":1e400,"ninf":-1e400,"negzero":-0,"big":12345678901234567890,"max_safe_plus":9007199254740993,"frac":0.1,"exp":1.5E+3,"under":1e-400}},{"name":"nums2","inputSchema":{"one":1,"hundred":100,"e21":1e+21,"e20":100000000000000000000,"tiny":1e-7,"small":0.000001,"inf":null,"ninf":null,"negzero":0,"big":12345678901234567000,"max_safe_plus":9007199254740992,"frac":0.1,"exp":1500,"under":0}}]',
  },
  {
    id: 'duplicate-keys',
    note: 'duplicate keys: the last value wins, at the first key’s position (names, descriptions and schemas alike)',
    input: '[{"name":"first","description":"d1","name":"second","inputSchema":{"a":1,"b":2,"a":3}},{"name":5,"name":"fixed","inputSchema":{"b":2,"a":3}},{"inputSchema":null,"name":"x","inputSchema":{"a":{"deep":1},"a":[]}}]',
  },
  // derivability: withheld wholes
  {
    id: 'withheld-one-candidate-boxes',
    note: 'tools whose candidate box holds one candidate are withheld (name "" alone; name "" and description ""; schema 0 alone)',
    input: '[{"name":""},{"name":"","description":""},{"inputSchema":0},{"name":"","description":"","inputSchema":1}]',
  },
  {
    id: 'withheld-box-unique-small-schemas',
    note: 'two-byte schemas ({}, [], -5, 10) with empty or absent strings: box-unique triples [1,0,1], [1,0,2], [1,1,2], [0,1,2] are withheld, with the class of the smallest other candidate when exactly one triple is box-unique',
    input: '[{"name":"","inputSchema":{}},{"name":"","inputSchema":[]},{"name":"","description":"","inputSchema":-5},{"description":"","inputSchema":10},{"name":"","description":"","inputSchema":{}}]',
  },
  {
    id: 'withholding-class-extension',
    note: 'boxes with exactly one box-unique triple: the class of the smallest other candidate is withheld too (name "" with a 3-byte schema), while a true triple outside the withholding class is published (name "ab" with schema {})',
    input: '[{"name":"","inputSchema":[0]},{"name":"","inputSchema":"ab"},{"name":"","inputSchema":123},{"name":"ab","inputSchema":{}},{"name":"a","inputSchema":{}},{"description":"ab","inputSchema":[]}]',
  },
  {
    id: 'withheld-at-catalogue-level',
    note: 'a catalogue whose summed part byte lengths leave a one-candidate box: the catalogue shares are withheld too',
    input: '[{"name":""},{"inputSchema":0}]',
  },
  {
    id: 'published-tiny-name',
    note: 'a one-letter name alone: the box {1,2,3} holds three candidates of one share class, so nothing is box-unique and the share is published',
    input: '[{"name":"a"}]',
  },
  {
    id: 'shares-exactly-half',
    note: 'shares decided on unrounded values at exactly one half',
    input: j([
      { name: 'aaaa', description: 'bbbb' },
      { name: 'x', inputSchema: 'x' },
      { name: 'lookup', description: 'Look up a record.', inputSchema: { type: 'object', properties: { id: { type: 'string' } } } },
    ]),
  },
  {
    id: 'description-only-catalogue',
    note: 'a catalogue of descriptions only: catalogue description share 1',
    input: j([{ description: 'The first tool has only a description.' }, { description: 'So does the second one, a little longer than the first.' }]),
  },
  {
    id: 'schema-only-catalogue',
    note: 'a catalogue of schemas only',
    input: j([{ inputSchema: { type: 'object', properties: { a: { type: 'string' }, b: { type: 'number' } } } }, { inputSchema: { type: 'object' } }]),
  },
  {
    id: 'precheck-r3-not-assessable',
    note: 'only one tool carries a schema: R-3 is NOT-ASSESSABLE at pre-check',
    input: j([{ name: 'one', description: 'The only schema.', inputSchema: { type: 'object' } }, { name: 'two', description: 'No schema.' }]),
  },
  // caps
  {
    id: 'max-size-200-tools',
    note: '200 generated tools (the tool cap) padded to exactly the 262,144-byte body cap: accepted',
    input: maxSizeCatalogue(),
    pad_to_bytes: 262144,
  },
  {
    id: 'at-body-cap',
    note: 'a small catalogue padded with trailing whitespace to exactly 262,144 bytes: accepted',
    input: j([{ name: 'ping', description: 'Check the service is up.', inputSchema: { type: 'object' } }]),
    pad_to_bytes: 262144,
  },
  {
    id: 'over-body-cap',
    note: 'the same catalogue padded to 262,145 bytes: refused naming the cap',
    input: j([{ name: 'ping', description: 'Check the service is up.', inputSchema: { type: 'object' } }]),
    pad_to_bytes: 262145,
  },
  {
    id: 'two-hundred-small-tools',
    note: 'exactly 200 tools: accepted',
    input: j(Array.from({ length: 200 }, (_, i) => ({ name: `tool_${i}`, inputSchema: { type: 'object' } }))),
  },
  {
    id: 'over-tool-cap',
    note: '201 tools: refused naming the cap',
    input: j(Array.from({ length: 201 }, (_, i) => ({ name: `tool_${i}` }))),
  },
  {
    id: 'over-tool-cap-before-malformed-entries',
    note: 'the tool cap is checked before entries: 201 non-object entries are over_tool_cap',
    input: j(Array.from({ length: 201 }, () => 1)),
  },
  // refusals
  { id: 'zero-tools-array', note: 'an empty array: not assessable', input: '[]' },
  { id: 'zero-tools-wrapper', note: 'an empty tools array', input: '{"tools":[],"nextCursor":"x"}' },
  { id: 'zero-tools-envelope', note: 'an envelope with an empty catalogue', input: '{"catalogue":[],"caller":"w"}' },
  { id: 'not-json-truncated', note: 'truncated JSON', input: '[{"name":"a"' },
  { id: 'not-json-trailing-garbage', note: 'text after the value', input: '[{"name":"a"}] x' },
  { id: 'not-json-single-quotes', note: 'single-quoted strings are not JSON', input: "[{'name':'a'}]" },
  { id: 'not-json-bom', note: 'a byte-order mark is not JSON whitespace', input: '\ufeff[{"name":"a"}]' },
  { id: 'not-json-invalid-utf8', note: 'a body that is not UTF-8', input_base64: Buffer.from([0x5b, 0x7b, 0x22, 0x6e, 0x61, 0x6d, 0x65, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d, 0x5d]).toString('base64') },
  { id: 'not-json-nan', note: 'NaN is not JSON', input: '[{"name":"a","inputSchema":NaN}]' },
  { id: 'malformed-catalogue-object', note: 'an object without a tools array', input: '{"items":[{"name":"a"}]}' },
  { id: 'malformed-catalogue-tools-object', note: 'tools is not an array', input: '{"tools":{"name":"a"}}' },
  { id: 'malformed-catalogue-string', note: 'a string is not a catalogue', input: '"tools"' },
  { id: 'malformed-catalogue-envelope-null', note: 'an envelope whose catalogue is null', input: '{"catalogue":null,"caller":"w"}' },
  { id: 'malformed-entry-number', note: 'a tool entry that is a number', input: '[1]' },
  { id: 'malformed-entry-array', note: 'a tool entry that is an array', input: '[[{"name":"a"}]]' },
  { id: 'malformed-entry-null-after-valid', note: 'a null entry after a valid one', input: '[{"name":"a"},null]' },
  { id: 'malformed-name-null', note: 'name null is present-but-non-string', input: '[{"name":null,"description":"d"}]' },
  { id: 'malformed-name-number', note: 'a numeric name', input: '[{"name":42}]' },
  { id: 'malformed-name-object', note: 'an object name', input: '[{"name":{"en":"a"}}]' },
  { id: 'malformed-name-duplicate-last-wins', note: 'duplicate name keys: the last value (a number) wins, so the entry is malformed', input: '[{"name":"ok","name":5}]' },
  { id: 'malformed-description-null', note: 'description null is present-but-non-string', input: '[{"name":"a","description":null}]' },
  { id: 'malformed-description-bool', note: 'a boolean description', input: '[{"name":"a","description":true}]' },
  { id: 'malformed-name-before-description', note: 'both malformed: the name is checked first', input: '[{"description":1,"name":2}]' },
];
