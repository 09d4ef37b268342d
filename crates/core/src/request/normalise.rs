//! Tool-result normalisation for the step fingerprint (SPEC §2.1): noise replaced by its kind.
//!
//! A stuck agent repeats one tool call and gets the same answer, but the answer's *bytes*
//! often differ: a clock (`date`, a log line), a duration (a test runner's `in 0.03s`), a
//! fresh id, a process id, a temporary path, colour codes, or the client's own envelope
//! (Codex CLI wraps every command's output in `Chunk ID: <random>` and `Wall time: …`). Before
//! a tool result enters the step fingerprint — and nowhere else: not the fingerprint, not the
//! forwarded bytes — [`normalise`] replaces each such span by the name of its kind (`<time>`,
//! `<duration>`, …; ANSI escapes are removed), so that two results that differ only by noise
//! read the same. What changes when an agent makes progress is kept as written: counts
//! (`3 of 10 done`), percentages, file names, exit codes, error texts. [`RULES`] lists the
//! kinds; it is what `/spec` shows.
//!
//! **Why a hand-written scanner.** This runs on every request with an assistant turn, over
//! every tool result after it (often kilobytes of command output). The text is walked once,
//! byte by byte, with no allocation until the first replacement; each rule is tried only
//! where its first byte can begin it (a digit or capital after a word boundary, `/`, `$`,
//! `[`, ESC, a line start), so most bytes cost one table look-up. A regex set would have to
//! run a dozen patterns (or one large alternation with look-around that the `regex` crate does
//! not have) and pull a dependency into the core crate; the rules here need a little
//! arithmetic besides (a plausible epoch range, a day of month, how random a token looks)
//! that patterns do not express. `benches/normalise.rs` measures it.
//!
//! The rules are deterministic and depend on nothing but the text (never the clock). They
//! are versioned by [`NORMALISATION_VERSION`]; a change to any rule moves it, and with it the
//! step fingerprint's domain tag (`step.rs`) and the digest version.

use std::borrow::Cow;

/// The version of the rules below. Moving it moves the step domain tag (a compile-time check
/// in `step.rs`), so step fingerprints of two rule sets are never compared.
pub const NORMALISATION_VERSION: u32 = 2;

/// Each kind of noise, as `(kind, what it replaces)`: the text written in its place, and the
/// rule. Listed by `/spec`.
pub const RULES: &[(&str, &str)] = &[
    (
        "<time>",
        "a clock reading: ISO 8601 / RFC 3339 date-times and dates (`2026-12-02T09:59:43.123Z`, \
         `2026-12-02 09:59:43,123+00:00`, `20261202T095943Z`), RFC 2822 and HTTP dates \
         (`Wed, 02 Dec 2026 09:59:43 +0000`, `… GMT`), `date` and ctime output \
         (`Wed Dec  2 09:59:43 UTC 2026`), `ls -l` times (`Dec  2 09:59`, `Dec  2  2025`), a time \
         of day with seconds (`09:59:43`, `09:59:43.789`), and epoch seconds, milliseconds, \
         microseconds or nanoseconds (10, 13, 16 or 19 digits between the years 2001 and 2100; \
         seconds may carry a fraction: `1796205985.0593803`)",
    ),
    (
        "<duration>",
        "a number with a unit of time: `0.034s`, `12 ms`, `1.2 seconds`, `350µs`, `3 min`, \
         and compounds such as `0m0.003s` (`time`) or `1h2m3s`; a bare `s` after a space only \
         with a fraction (`0.5 s`), `m` and `h` only inside a compound",
    ),
    ("<uuid>", "a UUID: 8-4-4-4-12 hex digits"),
    (
        "<hex>",
        "a hex id: at least 8 hex digits mixing digits and letters, or at least 12 of any mix \
         (a `0x` prefix included); a word made of them and nothing else",
    ),
    (
        "<id>",
        "a random-looking base64 or url-safe token of at least 20 letters and digits (`+ / - _` \
         between them, `=` padding after), both cases present, that changes class (upper, \
         lower, digit) at least 0.35 times per character with two digits or more, 0.45 with \
         one, 0.55 with none — as random ids do and words in identifiers do not; a word after \
         a prefix counts alone (`toolu_<id>`)",
    ),
    (
        "<pid>",
        "a process id: the number after `pid`, `ppid` or `PID` (`pid 1234`, `PID: 1234`, \
         `pid=1234`), in `name[1234]:`, and after a shell job number (`[1] 1234`)",
    ),
    (
        "<tmp>",
        "a temporary directory and every component under it but the last: `/tmp/…`, \
         `/var/tmp/…`, `/var/folders/…` and `/private/…` on macOS, `/dev/shm/…`, `$TMPDIR/…`, \
         `${TMPDIR}/…` (`/tmp/tmp.hboGCCWeBk/report.txt` reads `<tmp>/report.txt`)",
    ),
    (
        "",
        "ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] … BEL`, two- and three-byte \
         escapes): removed first, and the rules above read the text as if they had never been \
         there (a clock right after `ESC[2m`, as `tracing`, pytest and cargo print it, is a clock)",
    ),
    (
        "<envelope>",
        "the value of a client's own envelope line: Codex CLI's `Chunk ID:`, `Wall time:` and \
         `Original token count:` (at a line start); its `Process exited with code N` and \
         `Output:` lines are kept",
    ),
];

/// What is never replaced, for `/spec`.
pub const KEPT: &str = "counts and other numbers (`3 of 10 done`, `total 36`, sizes), \
    percentages, names of files, tests and identifiers, exit codes and error texts: a change \
    in them is progress";

/// Codex CLI's envelope lines whose value is noise (the label is kept).
const ENVELOPE: &[&str] = &["Chunk ID:", "Wall time:", "Original token count:"];

const WEEKDAYS: &[&str] = &[
    "Mon",
    "Tue",
    "Wed",
    "Thu",
    "Fri",
    "Sat",
    "Sun",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

const MONTHS: &[&str] = &[
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "May",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Sept",
    "Oct",
    "Nov",
    "Dec",
    "January",
    "February",
    "March",
    "April",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Zone names accepted after a time and a space (a fixed list: a bare capitalised word there
/// may be a log level, which is kept).
const ZONES: &[&str] = &[
    "UTC", "GMT", "Z", "CET", "CEST", "EET", "EEST", "WET", "WEST", "BST", "IST", "PST", "PDT",
    "MST", "MDT", "CST", "CDT", "EST", "EDT", "AKST", "AKDT", "HST", "JST", "KST", "AEST", "AEDT",
    "ACST", "NZST", "NZDT", "MSK", "SGT", "HKT",
];

/// Units of time, longest first within each prefix. `word`: may follow the number after a
/// space.
const UNITS: &[(&str, bool)] = &[
    ("nanoseconds", true),
    ("nanosecond", true),
    ("microseconds", true),
    ("microsecond", true),
    ("milliseconds", true),
    ("millisecond", true),
    ("seconds", true),
    ("second", true),
    ("minutes", true),
    ("minute", true),
    ("hours", true),
    ("hour", true),
    ("nsec", true),
    ("usec", true),
    ("msec", true),
    ("secs", true),
    ("sec", true),
    ("mins", true),
    ("min", true),
    ("hrs", true),
    ("hr", true),
    ("ns", true),
    ("us", true),
    ("\u{b5}s", true),
    ("\u{3bc}s", true),
    ("ms", true),
    ("s", false),
];

/// The text with its noise replaced (borrowed when there was none). Colour codes go first: a
/// value an escape ends right before (`ESC[2m09:59:43`) would otherwise not begin a word.
pub fn normalise(text: &str) -> Cow<'_, str> {
    if !text.as_bytes().contains(&0x1b) {
        return scan(text);
    }
    let plain = without_escapes(text);
    Cow::Owned(scan(&plain).into_owned())
}

/// The text without its ANSI escape sequences (each ends at an ASCII byte, or where the next
/// character starts, so the rest stays whole UTF-8).
fn without_escapes(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] == 0x1b {
            out.push_str(text.get(from..i).unwrap_or_default());
            let escape = i;
            i = ansi_end(b, i);
            // A sequence cut short by a multi-byte character ends before it.
            while i > escape + 1 && i < b.len() && !text.is_char_boundary(i) {
                i -= 1;
            }
            from = i;
        } else {
            i += 1;
        }
    }
    out.push_str(text.get(from..).unwrap_or_default());
    out
}

/// The rules over text without escapes.
fn scan(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    let mut out = Out::new(text);
    let mut i = 0;
    let mut line_start = true;
    // The end of the base64 run last looked at whole as an id (see [`random_id`]).
    let mut id_run_end = 0;
    while i < b.len() {
        if line_start {
            line_start = false;
            if let Some((value, end)) = envelope(b, i) {
                out.put(value, end, "<envelope>");
                i = end;
                continue;
            }
            if let Some((start, end)) = job_pid(b, i) {
                out.put(start, end, "<pid>");
                i = end;
                continue;
            }
        }
        match b[i] {
            b'\n' => {
                line_start = true;
                i += 1;
            }
            b'/' if !is_path(prev(b, i)) => match tmp_root(b, i).and_then(|r| tmp_path(b, r)) {
                Some(kept) => {
                    out.put(i, kept, "<tmp>");
                    i = kept;
                }
                None => i += 1,
            },
            b'$' => match tmpdir_var(b, i).and_then(|r| tmp_path(b, r)) {
                Some(kept) => {
                    out.put(i, kept, "<tmp>");
                    i = kept;
                }
                None => i += 1,
            },
            b'[' => match bracket_pid(b, i) {
                Some((start, end)) => {
                    out.put(start, end, "<pid>");
                    i = end;
                }
                None => i += 1,
            },
            c if c.is_ascii_alphanumeric() && !prev(b, i).is_ascii_alphanumeric() => {
                let whole_run = i >= id_run_end;
                match word(b, i, whole_run, &mut id_run_end) {
                    Some(Found::Replace(end, kind)) => {
                        out.put(i, end, kind);
                        i = end;
                    }
                    Some(Found::Span(start, end, kind)) => {
                        out.put(start, end, kind);
                        i = end;
                    }
                    None => i = alnum_end(b, i),
                }
            }
            _ => i += 1,
        }
    }
    out.finish()
}

/// The output, built only once something is replaced.
struct Out<'a> {
    src: &'a str,
    buf: String,
    from: usize,
    changed: bool,
}

impl<'a> Out<'a> {
    fn new(src: &'a str) -> Self {
        Out {
            src,
            buf: String::new(),
            from: 0,
            changed: false,
        }
    }

    /// Replace `src[start..end]` (both on character boundaries: every rule starts and ends
    /// its span at an ASCII byte or after a whole character) by `kind`.
    fn put(&mut self, start: usize, end: usize, kind: &str) {
        let start = start.max(self.from);
        if !self.changed {
            self.buf.reserve(self.src.len());
            self.changed = true;
        }
        self.buf
            .push_str(self.src.get(self.from..start).unwrap_or_default());
        self.buf.push_str(kind);
        self.from = end;
    }

    fn finish(mut self) -> Cow<'a, str> {
        if !self.changed {
            return Cow::Borrowed(self.src);
        }
        self.buf
            .push_str(self.src.get(self.from..).unwrap_or_default());
        Cow::Owned(self.buf)
    }
}

enum Found {
    /// Replace from the word's start to `.0` by `.1`.
    Replace(usize, &'static str),
    /// Replace `.0..` `.1` by `.2` (a process id after its label, an id with the separators
    /// that begin it).
    Span(usize, usize, &'static str),
}

fn prev(b: &[u8], i: usize) -> u8 {
    if i == 0 {
        b' '
    } else {
        b[i - 1]
    }
}

fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

fn alnum_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_alphanumeric() {
        i += 1;
    }
    i
}

fn digits_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    i
}

/// Exactly `n` digits at `i` and no more: their value.
fn exact_digits(b: &[u8], i: usize, n: usize) -> Option<u32> {
    if digits_end(b, i) != i + n {
        return None;
    }
    let mut v = 0u32;
    for &d in &b[i..i + n] {
        v = v * 10 + u32::from(d - b'0');
    }
    Some(v)
}

/// Whether a byte ends a token: not a letter or digit (end of text counts).
fn boundary(c: u8) -> bool {
    !c.is_ascii_alphanumeric()
}

/// A byte that can be part of a path.
fn is_path(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'.' | b'_' | b'-' | b'~' | b'/' | b'+' | b'@' | b'%' | b'=' | b'#'
        )
}

/// Inside a number: right after `1.`, `1,` or `1:` (the rest of a decimal, a list, a time).
fn mid_number(b: &[u8], i: usize) -> bool {
    i >= 2 && matches!(b[i - 1], b'.' | b',' | b':') && b[i - 2].is_ascii_digit()
}

/// Inside an identifier: right after `x_` or `x-` (`test_timeout_3s`, `retry-5s` keep theirs).
fn in_identifier(b: &[u8], i: usize) -> bool {
    i >= 2 && matches!(b[i - 1], b'_' | b'-') && b[i - 2].is_ascii_alphanumeric()
}

/// At a word start (`b[i]` alphanumeric, not preceded by one): the rule that matches, if
/// any. `whole_run`: the base64 run from here has not been looked at as an id yet.
fn word(b: &[u8], i: usize, whole_run: bool, id_run_end: &mut usize) -> Option<Found> {
    let c = b[i];
    if c.is_ascii_hexdigit() {
        if let Some(end) = uuid(b, i) {
            return Some(Found::Replace(end, "<uuid>"));
        }
    }
    // A random token first, whole: its beginning may look like a number (`0hr_p54CCK…`).
    if whole_run {
        if let Some(found) = random_id(b, i, true, id_run_end).map(|end| id_span(b, i, end)) {
            return Some(found);
        }
    }
    if c.is_ascii_digit() && !mid_number(b, i) {
        if let Some(end) = iso_datetime(b, i) {
            return Some(Found::Replace(end, "<time>"));
        }
        if let Some(end) = time_of_day(b, i, true).and_then(|e| clock_end(b, e)) {
            return Some(Found::Replace(end, "<time>"));
        }
        if let Some(end) = date_words(b, i) {
            return Some(Found::Replace(end, "<time>"));
        }
        if let Some(end) = epoch(b, i) {
            return Some(Found::Replace(end, "<time>"));
        }
        if !in_identifier(b, i) {
            if let Some(end) = duration(b, i) {
                return Some(Found::Replace(end, "<duration>"));
            }
        }
    } else if c.is_ascii_uppercase() {
        if let Some(end) = date_words(b, i) {
            return Some(Found::Replace(end, "<time>"));
        }
    }
    if c.is_ascii_alphabetic() {
        if let Some((start, end)) = labelled_pid(b, i) {
            return Some(Found::Span(start, end, "<pid>"));
        }
    }
    if !mid_number(b, i) {
        if let Some(end) = hex_id(b, i) {
            return Some(Found::Replace(end, "<hex>"));
        }
    }
    if whole_run {
        return None;
    }
    random_id(b, i, false, id_run_end).map(|end| Found::Replace(end, "<id>"))
}

/// An id found at the word start `i`, with the `-`, `_`, `+` or `/` that begin it
/// (`-fKl-mMjH865…`: url-safe ids may start with one).
fn id_span(b: &[u8], i: usize, end: usize) -> Found {
    let mut start = i;
    while start > 0 && matches!(b[start - 1], b'-' | b'_' | b'+' | b'/') {
        start -= 1;
    }
    if start > 0 && is_b64(b[start - 1]) {
        start = i;
    }
    Found::Span(start, end, "<id>")
}

// --- clocks ----------------------------------------------------------------------------------

/// `YYYY-MM-DD`, optionally `[T ]HH:MM[:SS[.frac]]` and a zone; or the basic form
/// `YYYYMMDDTHHMMSS[.frac][Z]`.
fn iso_datetime(b: &[u8], i: usize) -> Option<usize> {
    if let Some(year) = exact_digits(b, i, 4) {
        if !(1900..=2199).contains(&year) || at(b, i + 4) != b'-' {
            return None;
        }
        let month = exact_digits(b, i + 5, 2)?;
        if !(1..=12).contains(&month) || at(b, i + 7) != b'-' {
            return None;
        }
        let day = exact_digits(b, i + 8, 2)?;
        if !(1..=31).contains(&day) {
            return None;
        }
        let date_end = i + 10;
        if matches!(at(b, date_end), b'T' | b' ' | b'_') {
            if let Some(end) = time_of_day(b, date_end + 1, false).and_then(|e| clock_end(b, e)) {
                return Some(end);
            }
        }
        return boundary(at(b, date_end)).then_some(date_end);
    }
    // Basic format.
    let date = exact_digits(b, i, 8)?;
    let (year, month, day) = (date / 10_000, date / 100 % 100, date % 100);
    if !(1900..=2199).contains(&year)
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || at(b, i + 8) != b'T'
    {
        return None;
    }
    let hms = exact_digits(b, i + 9, 6)?;
    if hms / 10_000 > 23 || hms / 100 % 100 > 59 || hms % 100 > 60 {
        return None;
    }
    let mut end = fraction(b, i + 15);
    if at(b, end) == b'Z' {
        end += 1;
    }
    boundary(at(b, end)).then_some(end)
}

/// `H:MM:SS` or `HH:MM:SS` with an optional `.frac` / `,frac`; `HH:MM` alone when
/// `need_seconds` is false. The end is not checked for a boundary (a zone may follow).
fn time_of_day(b: &[u8], i: usize, need_seconds: bool) -> Option<usize> {
    let h_end = digits_end(b, i);
    let h_len = h_end - i;
    if !(1..=2).contains(&h_len) || at(b, h_end) != b':' {
        return None;
    }
    let hour = exact_digits(b, i, h_len)?;
    let minute = exact_digits(b, h_end + 1, 2)?;
    if hour > 23 || minute > 59 {
        return None;
    }
    let m_end = h_end + 3;
    if at(b, m_end) == b':' {
        let second = exact_digits(b, m_end + 1, 2)?;
        return (second <= 60).then(|| fraction(b, m_end + 3));
    }
    (!need_seconds).then_some(m_end)
}

/// After a time: its zone, then a word boundary.
fn clock_end(b: &[u8], time_end: usize) -> Option<usize> {
    let end = zone(b, time_end);
    boundary(at(b, end)).then_some(end)
}

/// After `i`: `.digits` or `,digits` (a fraction of a second), else `i`.
fn fraction(b: &[u8], i: usize) -> usize {
    if matches!(at(b, i), b'.' | b',') && at(b, i + 1).is_ascii_digit() {
        digits_end(b, i + 1)
    } else {
        i
    }
}

/// After a time: `Z`, `±HH[:MM]`, `±HHMM`, or a space and a zone name / offset; else `i`.
fn zone(b: &[u8], i: usize) -> usize {
    match at(b, i) {
        b'Z' if boundary(at(b, i + 1)) => i + 1,
        b'+' | b'-' => offset(b, i).unwrap_or(i),
        b' ' => {
            if matches!(at(b, i + 1), b'+' | b'-') {
                return offset(b, i + 1).unwrap_or(i);
            }
            let end = alnum_end(b, i + 1);
            let name = &b[i + 1..end];
            if ZONES.iter().any(|z| z.as_bytes() == name) {
                end
            } else if name == b"AM" || name == b"PM" {
                zone(b, end)
            } else {
                i
            }
        }
        _ => i,
    }
}

/// `±HH`, `±HHMM` or `±HH:MM` at `i` (the sign).
fn offset(b: &[u8], i: usize) -> Option<usize> {
    let d = digits_end(b, i + 1);
    match d - (i + 1) {
        4 => boundary(at(b, d)).then_some(d),
        2 if at(b, d) == b':' && exact_digits(b, d + 1, 2).is_some() => {
            boundary(at(b, d + 3)).then_some(d + 3)
        }
        2 => boundary(at(b, d)).then_some(d),
        _ => None,
    }
}

/// A weekday or month name as written (`Dec`, `December`) or, for the short names, in
/// capitals (`DEC`).
fn is_name(list: &[&str], word: &[u8]) -> bool {
    list.iter().any(|name| {
        let n = name.as_bytes();
        n == word
            || (n.len() == 3
                && word.len() == 3
                && word.iter().all(u8::is_ascii_uppercase)
                && n.eq_ignore_ascii_case(word))
    })
}

/// A date written with names: a run of a weekday, a month name, a day, a year, a time and a
/// zone, in any of the orders `date`, RFC 2822, HTTP, ctime and `ls -l` use
/// (`Wed Dec  2 09:59:43 UTC 2026`, `Wed, 02 Dec 2026 09:59:43 GMT`, `Dec  2 09:59`). It
/// needs a month, a day, and a time or a year.
fn date_words(b: &[u8], i: usize) -> Option<usize> {
    let (mut month, mut day, mut year, mut time) = (false, false, false, false);
    let mut after_time = false;
    let mut j = i;
    let mut end = i;
    let mut tokens = 0;
    loop {
        let c = at(b, j);
        let token_end = if c.is_ascii_alphabetic() {
            let w_end = alnum_end(b, j);
            let w = &b[j..w_end];
            if tokens == 0 && is_name(WEEKDAYS, w) {
                Some(w_end)
            } else if !month && is_name(MONTHS, w) {
                month = true;
                Some(w_end)
            } else if after_time && ZONES.iter().any(|z| z.as_bytes() == w) {
                Some(w_end)
            } else {
                None
            }
        } else if c.is_ascii_digit() {
            let d_end = digits_end(b, j);
            let n = d_end - j;
            if (1..=2).contains(&n) && at(b, d_end) == b':' && !time {
                let t = time_of_day(b, j, false).filter(|&e| boundary(at(b, e)));
                time = t.is_some();
                t
            } else if (1..=2).contains(&n) && !day && boundary(at(b, d_end)) {
                let v = exact_digits(b, j, n).unwrap_or(0);
                day = (1..=31).contains(&v);
                day.then_some(d_end)
            } else if n == 4
                && !year
                && boundary(at(b, d_end))
                && !matches!(at(b, d_end), b'-' | b'/' | b':')
            {
                let v = exact_digits(b, j, 4).unwrap_or(0);
                year = (1970..=2199).contains(&v);
                year.then_some(d_end)
            } else {
                None
            }
        } else if matches!(c, b'+' | b'-') && after_time {
            offset(b, j)
        } else {
            None
        };
        let Some(token_end) = token_end else { break };
        // A zone or an offset may follow only a time.
        after_time = b[j..token_end].contains(&b':');
        tokens += 1;
        end = token_end;
        // Separators: an optional comma, then one to three spaces (`Dec  2  2025`); an
        // offset may follow a time directly (`09:59:43+0000`).
        j = token_end;
        if at(b, j) == b',' {
            j += 1;
        }
        let spaces = j;
        while at(b, j) == b' ' && j - spaces < 3 {
            j += 1;
        }
        if j == spaces && !(after_time && matches!(at(b, j), b'+' | b'-')) {
            break;
        }
    }
    (month && day && (time || year) && tokens >= 3).then_some(end)
}

/// Epoch seconds, ms, µs or ns: 10, 13, 16 or 19 digits whose seconds fall in 2001..2100
/// (seconds may carry a fraction).
fn epoch(b: &[u8], i: usize) -> Option<usize> {
    let end = digits_end(b, i);
    let n = end - i;
    if !matches!(n, 10 | 13 | 16 | 19) {
        return None;
    }
    let seconds: u64 = std::str::from_utf8(&b[i..i + 10]).ok()?.parse().ok()?;
    if !(1_000_000_000..=4_102_444_800).contains(&seconds) {
        return None;
    }
    let end = if n == 10 && at(b, end) == b'.' && at(b, end + 1).is_ascii_digit() {
        digits_end(b, end + 1)
    } else {
        end
    };
    boundary(at(b, end)).then_some(end)
}

// --- durations -------------------------------------------------------------------------------

/// One number and its unit at `i`: the end, and whether the unit was `m` or `h` (allowed only
/// inside a compound).
fn number_unit(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let int_end = digits_end(b, i);
    if int_end == i {
        return None;
    }
    let (num_end, has_fraction) = if at(b, int_end) == b'.' && at(b, int_end + 1).is_ascii_digit() {
        (digits_end(b, int_end + 1), true)
    } else {
        (int_end, false)
    };
    // `m` / `h` right after the number (compound parts: `0m`, `1h`).
    if matches!(at(b, num_end), b'm' | b'h') && !at(b, num_end + 1).is_ascii_alphabetic() {
        return Some((num_end + 1, true));
    }
    let (unit_at, spaced) = if at(b, num_end) == b' ' {
        (num_end + 1, true)
    } else {
        (num_end, false)
    };
    let rest = &b[unit_at.min(b.len())..];
    for (unit, word) in UNITS {
        let u = unit.as_bytes();
        if rest.starts_with(u) && !at(b, unit_at + u.len()).is_ascii_alphanumeric() {
            if spaced && !*word && !has_fraction {
                return None;
            }
            return Some((unit_at + u.len(), false));
        }
    }
    None
}

/// A duration: one or more number+unit parts (`0.034s`, `12 ms`, `0m0.003s`, `1h 2m 3s`).
fn duration(b: &[u8], i: usize) -> Option<usize> {
    let (mut end, mut only_mh) = number_unit(b, i)?;
    let mut parts = 1;
    loop {
        let next = if at(b, end) == b' ' { end + 1 } else { end };
        match number_unit(b, next) {
            Some((e, mh)) if at(b, next).is_ascii_digit() => {
                end = e;
                only_mh &= mh;
                parts += 1;
            }
            _ => break,
        }
    }
    // `5m` alone is not a duration (minutes or metres); `5m30s` is.
    (!only_mh || parts > 1).then_some(end)
}

// --- ids -------------------------------------------------------------------------------------

/// 8-4-4-4-12 hex digits.
fn uuid(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    for (k, len) in [8usize, 4, 4, 4, 12].into_iter().enumerate() {
        if k > 0 {
            if at(b, j) != b'-' {
                return None;
            }
            j += 1;
        }
        if !b.get(j..j + len)?.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        j += len;
    }
    boundary(at(b, j)).then_some(j)
}

/// A word that is all hex digits (after an optional `0x`): at least 8 mixing digits and
/// letters, or at least 12 with a letter; with `0x`, at least 8 of any mix. A number in
/// plain decimal is never one (it is a count or a result), unless it is an epoch.
fn hex_id(b: &[u8], i: usize) -> Option<usize> {
    let end = alnum_end(b, i);
    let prefixed = at(b, i) == b'0' && matches!(at(b, i + 1), b'x' | b'X');
    let w = &b[if prefixed { i + 2 } else { i }..end];
    if w.len() < 8 || !w.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let digit = w.iter().any(u8::is_ascii_digit);
    let letter = w.iter().any(u8::is_ascii_alphabetic);
    (prefixed || (letter && (digit || w.len() >= 12))).then_some(end)
}

fn is_b64(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'-' | b'_')
}

/// A random-looking base64 / url-safe token (see [`RULES`]) at the word start `i`.
///
/// Looked at once whole (the run of base64 characters from `i`, `whole_run`), then, inside
/// a run that was not one, each word of it alone (an id after a prefix: `toolu_<id>`), so
/// that every byte is looked at at most twice.
fn random_id(b: &[u8], i: usize, whole_run: bool, id_run_end: &mut usize) -> Option<usize> {
    let mut end = if whole_run {
        let mut e = i;
        while e < b.len() && is_b64(b[e]) {
            e += 1;
        }
        *id_run_end = e;
        // A `/` at the end is a directory's (`dir/`); `-`, `_` and `+` are the token's.
        while e > i && b[e - 1] == b'/' {
            e -= 1;
        }
        e
    } else {
        alnum_end(b, i)
    };
    if end - i < 20 || !looks_random(&b[i..end]) {
        return None;
    }
    while at(b, end) == b'=' {
        end += 1;
    }
    boundary(at(b, end)).then_some(end)
}

/// At least 20 letters and digits, both cases, changing class (upper, lower, digit) often
/// (separators start a new run). Words in identifiers change class about every 3 to 5
/// characters (`TestParseHttp2Request`), random tokens about every 1.6.
pub(crate) fn looks_random(w: &[u8]) -> bool {
    let (mut upper, mut lower, mut digit, mut runs) = (0usize, 0usize, 0usize, 0usize);
    let mut last = 0u8;
    for &c in w {
        let class = if c.is_ascii_uppercase() {
            upper += 1;
            1
        } else if c.is_ascii_lowercase() {
            lower += 1;
            2
        } else if c.is_ascii_digit() {
            digit += 1;
            3
        } else {
            last = 0;
            continue;
        };
        if class != last {
            runs += 1;
        }
        last = class;
    }
    let n = upper + lower + digit;
    if n < 20 || upper == 0 || lower == 0 {
        return false;
    }
    // Runs per character: at least 0.35 with two digits or more, 0.45 with one, 0.55 with
    // none (a 22-character random token passes about 98 times in 100, a 32-character one
    // 99.4; 0.15 % of the long mixed-case words in this repository's and its Python
    // dependencies' sources do).
    let needed = match digit {
        0 => 11,
        1 => 9,
        _ => 7,
    };
    runs * 20 >= n * needed
}

// --- process ids -----------------------------------------------------------------------------

/// `pid 1234`, `PID: 1234`, `pid=1234`, `ppid 1`: the digits' span.
fn labelled_pid(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let w_end = alnum_end(b, i);
    let w = &b[i..w_end];
    if !(w.eq_ignore_ascii_case(b"pid") || w.eq_ignore_ascii_case(b"ppid")) {
        return None;
    }
    let mut j = w_end;
    if matches!(at(b, j), b':' | b'=') {
        j += 1;
    }
    if at(b, j) == b' ' {
        j += 1;
    }
    let d_end = digits_end(b, j);
    (d_end > j && d_end - j <= 10 && boundary(at(b, d_end))).then_some((j, d_end))
}

/// `name[1234]:`: the digits' span.
fn bracket_pid(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if !prev(b, i).is_ascii_alphanumeric() {
        return None;
    }
    let d_end = digits_end(b, i + 1);
    (d_end > i + 1 && d_end - i - 1 <= 10 && at(b, d_end) == b']' && at(b, d_end + 1) == b':')
        .then_some((i + 1, d_end))
}

/// A shell's job line at a line start: `[1] 1234` or `[2]+ 1234`: the pid's span.
fn job_pid(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if at(b, i) != b'[' {
        return None;
    }
    let n_end = digits_end(b, i + 1);
    if n_end == i + 1 || at(b, n_end) != b']' {
        return None;
    }
    let mut j = n_end + 1;
    if matches!(at(b, j), b'+' | b'-') {
        j += 1;
    }
    if at(b, j) != b' ' {
        return None;
    }
    while at(b, j) == b' ' {
        j += 1;
    }
    let d_end = digits_end(b, j);
    (d_end > j && matches!(at(b, d_end), b'\n' | b'\r' | 0)).then_some((j, d_end))
}

// --- paths, escapes, envelopes ---------------------------------------------------------------

const TMP_ROOTS: &[&str] = &[
    "/tmp",
    "/var/tmp",
    "/var/folders",
    "/private/tmp",
    "/private/var/folders",
    "/dev/shm",
];

/// A temporary directory's root at `i` (a `/` that begins a path): where it ends.
fn tmp_root(b: &[u8], i: usize) -> Option<usize> {
    let rest = &b[i..];
    TMP_ROOTS
        .iter()
        .find(|r| rest.starts_with(r.as_bytes()) && !is_word_char(at(b, i + r.len())))
        .map(|r| i + r.len())
}

/// `$TMPDIR` or `${TMPDIR}` at `i`: where it ends.
fn tmpdir_var(b: &[u8], i: usize) -> Option<usize> {
    let rest = &b[i..];
    [&b"${TMPDIR}"[..], b"$TMPDIR"]
        .into_iter()
        .find(|var| rest.starts_with(var) && !is_word_char(at(b, i + var.len())))
        .map(|var| i + var.len())
}

fn is_word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The path after a temporary root (ending at `root_end`): where the part to keep starts —
/// the `/` before its last component when it has two or more, else the path's end.
fn tmp_path(b: &[u8], root_end: usize) -> Option<usize> {
    let mut end = root_end;
    while end < b.len() && is_path(b[end]) {
        end += 1;
    }
    // A full stop or comma that ends a sentence is not part of the path.
    while end > root_end && matches!(b[end - 1], b'.' | b',') {
        end -= 1;
    }
    let path = &b[root_end..end];
    let components = path.split(|&c| c == b'/').filter(|c| !c.is_empty()).count();
    if components >= 2 && path.last() != Some(&b'/') {
        path.iter().rposition(|&c| c == b'/').map(|p| root_end + p)
    } else {
        Some(end)
    }
}

/// The end of the ANSI escape sequence at `i` (ESC).
fn ansi_end(b: &[u8], i: usize) -> usize {
    match at(b, i + 1) {
        b'[' => {
            let mut j = i + 2;
            while (0x30..=0x3f).contains(&at(b, j)) {
                j += 1;
            }
            while (0x20..=0x2f).contains(&at(b, j)) {
                j += 1;
            }
            if (0x40..=0x7e).contains(&at(b, j)) {
                j + 1
            } else {
                j
            }
        }
        b']' => {
            let mut j = i + 2;
            while j < b.len() {
                if b[j] == 0x07 {
                    return j + 1;
                }
                if b[j] == 0x1b && at(b, j + 1) == b'\\' {
                    return j + 2;
                }
                if b[j] == b'\n' {
                    return j;
                }
                j += 1;
            }
            j
        }
        b'(' | b')' | b'*' | b'+' | b'#' if at(b, i + 2).is_ascii_graphic() => i + 3,
        c if (0x40..=0x7e).contains(&c) || c.is_ascii_digit() || c == b'=' || c == b'>' => i + 2,
        _ => i + 1,
    }
}

/// A client envelope line at `i` (a line start): where its value starts, and the line's end.
fn envelope(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let rest = &b[i..];
    let label = ENVELOPE.iter().find(|l| rest.starts_with(l.as_bytes()))?;
    let mut value = i + label.len();
    if at(b, value) == b' ' {
        value += 1;
    }
    let end = rest
        .iter()
        .position(|&c| c == b'\n' || c == b'\r')
        .map_or(b.len(), |p| i + p);
    Some((value, end.max(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> String {
        normalise(text).into_owned()
    }

    #[test]
    fn each_kind_of_noise_reads_as_its_kind() {
        for (text, expected) in [
            // Clocks.
            ("2026-12-02T09:59:43Z", "<time>"),
            ("at 2026-12-02T09:59:43.123456789Z.", "at <time>."),
            ("2026-12-02 09:59:43,301 INFO go", "<time> INFO go"),
            ("2026-12-02 10:06:22.301970899+00:00", "<time>"),
            ("2026-12-02T10:06:28+00:00 3 of 10 done", "<time> 3 of 10 done"),
            ("2026-12-02T10:06", "<time>"),
            ("backup-2026-12-02.tar", "backup-<time>.tar"),
            ("20261202T095943Z", "<time>"),
            ("Wed, 02 Dec 2026 10:06:22 +0000", "<time>"),
            ("Date: Wed, 02 Dec 2026 10:06:22 GMT\n", "Date: <time>\n"),
            ("Wed Dec  2 10:06:18 UTC 2026\nREADME.md", "<time>\nREADME.md"),
            ("Wed Dec  2 10:06:22 2026", "<time>"),
            ("02 Dec 2026 10:06:22", "<time>"),
            ("-rw-r--r-- 1 root root 0 Dec  2 10:06 report.txt", "-rw-r--r-- 1 root root 0 <time> report.txt"),
            ("-rw-r--r-- 1 root root 0 Dec  2  2025 old.txt", "-rw-r--r-- 1 root root 0 <time> old.txt"),
            ("10:07:35 attempt 1", "<time> attempt 1"),
            ("build at 10:06:28.026771028 in", "build at <time> in"),
            ("09:59:43 PM UTC", "<time>"),
            ("1796205985.0593803\n1796205985059394293\n1796205985063", "<time>\n<time>\n<time>"),
            ("ts=1796205985123456 x", "ts=<time> x"),
            // Durations.
            ("3 passed in 0.08s", "3 passed in <duration>"),
            ("0.05s call     test_sample.py::test_slow", "<duration> call     test_sample.py::test_slow"),
            ("took 120ms, then 12 ms", "took <duration>, then <duration>"),
            ("Wall clock 1.2 seconds", "Wall clock <duration>"),
            ("real\t0m0.023s\nuser\t0m0.001s", "real\t<duration>\nuser\t<duration>"),
            ("in 1h2m3s", "in <duration>"),
            ("Time: 0.5 s", "Time: <duration>"),
            ("350\u{b5}s", "<duration>"),
            ("(1 durations < 0.005s hidden.", "(1 durations < <duration> hidden."),
            // Ids.
            ("job 1a87be98-e63d-4285-bf08-d9d5f29c7677 ok", "job <uuid> ok"),
            ("trace 98b97295ad61bae4df578d1ff80528c7", "trace <hex>"),
            ("commit deadbeef12", "commit <hex>"),
            ("at 0x7ffd5e8c1a2b>", "at <hex>>"),
            ("call_abc123def456", "call_<hex>"),
            ("web-7d4b9c8f6-x2k9p", "web-<hex>-x2k9p"),
            ("token eX0DKvQzd8wS7tVFMpyFvK0vBDZJ2jlA", "token <id>"),
            ("token -fKl-mMjH865wPYkLeNFbR_lWvDLGBKz", "token <id>"),
            ("token -y55UvjXolMBRONPA-NMBedKpSlSn-Po.", "token <id>."),
            ("token rkaa7HXXrNgiQANu6UAzRYfGkx3MKo1_ ok", "token <id> ok"),
            ("toolu_01A09q90qw90lq917835lq9", "<id>"),
            ("see chatcmpl-AbC123dEf456GhI789jKl0.", "see <id>."),
            ("id vlR7PnpV2Ce81l0PRw6jlUpck7Jo5ZsQjryTjKlc5aLWGVHPZLj5NeC6qMa0emYBDXOo6QBU0Wo=", "id <id>"),
            // Process ids.
            ("job x pid 23163", "job x pid <pid>"),
            ("PID: 42 (pid=7, ppid 1)", "PID: <pid> (pid=<pid>, ppid <pid>)"),
            ("worker[23164]: ready", "worker[<pid>]: ready"),
            ("[1] 12345\n[2]+ 777", "[1] <pid>\n[2]+ <pid>"),
            // Temporary paths.
            ("wrote /tmp/tmp.hboGCCWeBk/report.txt", "wrote <tmp>/report.txt"),
            ("cd /tmp/tmp.hboGCCWeBk && ls", "cd <tmp> && ls"),
            ("in /tmp.", "in <tmp>."),
            ("/tmp/pytest-of-root/pytest-3/test_a0/out.log:12: error", "<tmp>/out.log:12: error"),
            ("/var/folders/x7/abc123/T/tmpq/f.py", "<tmp>/f.py"),
            ("$TMPDIR/build-1/a.o and ${TMPDIR}/b", "<tmp>/a.o and <tmp>"),
            // ANSI and envelopes.
            ("\u{1b}[1;32mPASS\u{1b}[0m ok", "PASS ok"),
            ("\u{1b}]0;title\u{7}x", "x"),
            (
                "Chunk ID: 3ca58a\nWall time: 0.8635 seconds\nProcess exited with code 0\nOriginal token count: 19\nOutput:\nok\n",
                "Chunk ID: <envelope>\nWall time: <envelope>\nProcess exited with code 0\nOriginal token count: <envelope>\nOutput:\nok\n",
            ),
        ] {
            assert_eq!(n(text), expected, "{text:?}");
        }
    }

    #[test]
    fn a_value_right_after_a_colour_code_is_normalised() {
        // `tracing`, pytest and cargo dim a timestamp: ESC[2m before it, ESC[0m after.
        for (text, expected) in [
            (
                "\u{1b}[2m2026-12-02T09:59:43.123Z\u{1b}[0m INFO ok",
                "<time> INFO ok",
            ),
            ("\u{1b}[2m09:59:43\u{1b}[0m done", "<time> done"),
            ("took \u{1b}[1m0.034s\u{1b}[0m", "took <duration>"),
            ("\u{1b}[32mpid 4242\u{1b}[0m", "pid <pid>"),
            ("\u{1b}[2mChunk ID: 9f8e7d\u{1b}[0m", "Chunk ID: <envelope>"),
            // Progress after a colour code stays.
            ("\u{1b}[32m3 of 10 done\u{1b}[0m", "3 of 10 done"),
            // A lone escape before a multi-byte character never splits it.
            ("\u{1b}é ok", "é ok"),
        ] {
            assert_eq!(n(text), expected, "{text:?}");
        }
        assert_eq!(
            n("\u{1b}[2m2026-12-02T09:59:43Z\u{1b}[0m"),
            n("\u{1b}[2m2026-12-03T11:00:00Z\u{1b}[0m")
        );
    }

    #[test]
    fn progress_is_kept() {
        for text in [
            "3 of 10 done",
            "45% complete, 12 files, total 36",
            "Process exited with code 1",
            "Exit code 2",
            "FAILED test_flaky.py::test_alpha - AssertionError: alpha broke on run 1",
            "test_flaky.py:8: AssertionError",
            "1 failed, 2 passed",
            "-rw-r--r-- 1 root root   45 README.md",
            "drwx------  2 root root 4096 .",
            "item5.txt main.py test_sample.py",
            "v1.2.3 and 3.141592653589793 and 49999995000000",
            "test_timeout_3s retry-5s",
            "May 3 of them fail",
            "src/main.rs:12:34: error[E0308]: mismatched types",
            "TestParseHttp2RequestHandler ERR_CONNECTION_REFUSED_BY_PEER2 Base64EncoderV2Test",
            "AbstractSingletonProxyFactoryBean2 tests/integration/test_api_v2_endpoints",
            "commit 59a6ddc (7 hex digits: a short commit id is a name)",
            "/usr/lib/x86_64-linux-gnu/libc.so.6 /home/me/tmp/file /tmpfile",
            "2026 items, 5m of cable, 3h of work",
            "arr[3] = 1; list[12]",
            "1234567890 is not in a sentence about seconds? it is: epoch-like",
        ] {
            let expected = if text.starts_with("1234567890") {
                "<time> is not in a sentence about seconds? it is: epoch-like".to_string()
            } else {
                text.to_string()
            };
            assert_eq!(n(text), expected, "{text:?}");
        }
        assert!(matches!(normalise("3 of 10 done"), Cow::Borrowed(_)));
    }

    #[test]
    fn non_ascii_text_passes_through_whole() {
        let text = "résumé 2026-12-02T09:59:43Z ✓ naïve — 12 ms — 日本語";
        assert_eq!(n(text), "résumé <time> ✓ naïve — <duration> — 日本語");
        assert_eq!(n("\u{1b}"), "");
        assert_eq!(n("/tmp"), "<tmp>");
        assert_eq!(n(""), "");
    }
}
