//! Escaping for text written into HTML and SVG by hand: the economics plot writes every
//! caller-derived string through [`esc`]. (The ledger page renders with maud's templates,
//! which escape by construction.)

/// Escape text for HTML/SVG text and attribute values (double- or single-quoted).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::esc;

    #[test]
    fn every_markup_character_is_escaped_and_nothing_else() {
        assert_eq!(
            esc(r#"<a href="x" title='y'>&é</a>"#),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;é&lt;/a&gt;"
        );
        assert_eq!(esc("plain text, 12 %"), "plain text, 12 %");
    }
}
