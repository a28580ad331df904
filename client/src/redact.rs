//! Hiding credentials in endpoint URLs before they reach a log line, an
//! error message or a metrics label. Hub and node RPC endpoints often carry
//! an API key, as userinfo (`https://user:key@host`) or in the query
//! (`?api_key=...`, `?key=...`, `?token=...`); [`redact_url`] keeps the
//! scheme, host, port and path, which is what an operator needs to tell
//! endpoints apart, and replaces the userinfo and every query value (and
//! any fragment) with `***`. Keys in path segments are not recognised.

/// What replaces a hidden part.
pub const HIDDEN: &str = "***";

/// `url` with its userinfo, query values and fragment replaced by `***`:
/// `https://u:p@h:8443/rpc?api_key=k&v=1#x` becomes
/// `https://***@h:8443/rpc?api_key=***&v=***#***`. A URL without those
/// parts is returned unchanged.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    match authority.rfind('@') {
        // Only a URL with a scheme has an authority; without one, an `@`
        // is just text.
        Some(at) if !scheme.is_empty() => {
            out.push_str(HIDDEN);
            out.push_str(&authority[at..]);
        }
        _ => out.push_str(authority),
    }
    let (before_fragment, fragment) = match tail.find('#') {
        Some(i) => (&tail[..i], Some(())),
        None => (tail, None),
    };
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) => format!("{k}={HIDDEN}"),
                    None => pair.to_string(),
                })
                .collect();
            out.push_str(&pairs.join("&"));
        }
        None => out.push_str(before_fragment),
    }
    if fragment.is_some() {
        out.push('#');
        out.push_str(HIDDEN);
    }
    out
}

/// [`redact_url`] applied to every `scheme://...` URL inside `text` (an
/// error message from an HTTP library that quotes the URL it called). A
/// URL ends at whitespace or a quote or angle bracket, without the
/// punctuation (`:`, `,`, `.`, `;`, `)`, `]`) that closes it in prose.
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-` and `.` just before.
        let scheme_start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |j| j + 1);
        let mut end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |j| i + j);
        // Punctuation that ends a sentence or a clause is not the URL's.
        while end > i + 3 && rest[..end].ends_with([':', ',', '.', ';', ')', ']']) {
            end -= 1;
        }
        out.push_str(&rest[..scheme_start]);
        if scheme_start == i {
            // "://" with no scheme before it: not a URL.
            out.push_str(&rest[i..i + 3]);
            rest = &rest[i + 3..];
            continue;
        }
        out.push_str(&redact_url(&rest[scheme_start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_values_and_fragments_are_hidden() {
        let cases = [
            ("http://127.0.0.1:26657", "http://127.0.0.1:26657"),
            ("http://127.0.0.1:26657/", "http://127.0.0.1:26657/"),
            (
                "https://hub.example.com:8443/v1/rpc",
                "https://hub.example.com:8443/v1/rpc",
            ),
            (
                "https://alice:s3cret@hub.example.com/rpc",
                "https://***@hub.example.com/rpc",
            ),
            (
                "https://tok3n@hub.example.com",
                "https://***@hub.example.com",
            ),
            (
                "https://u:p%40ss@hub.example.com:443?x=1",
                "https://***@hub.example.com:443?x=***",
            ),
            (
                "https://rpc.example.com/v2/path?api_key=K3Y&network=main",
                "https://rpc.example.com/v2/path?api_key=***&network=***",
            ),
            (
                "https://rpc.example.com/?key=K3Y",
                "https://rpc.example.com/?key=***",
            ),
            (
                "https://rpc.example.com?token=T0K#frag",
                "https://rpc.example.com?token=***#***",
            ),
            (
                "https://rpc.example.com/?flag",
                "https://rpc.example.com/?flag",
            ),
            (
                "https://a:b@rpc.example.com:1/p?key=K&token=T",
                "https://***@rpc.example.com:1/p?key=***&token=***",
            ),
            // An `@` in the path or query is no userinfo.
            (
                "https://rpc.example.com/users/me@x?k=v@w",
                "https://rpc.example.com/users/me@x?k=***",
            ),
            ("127.0.0.1:26657?api_key=K3Y", "127.0.0.1:26657?api_key=***"),
            ("", ""),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn urls_inside_messages_are_hidden() {
        let msg = "https://u:s3cret@hub.example.com/rpc?api_key=K3Y: Connection Failed: \
                   Connect error: connection refused (os error 111)";
        let got = redact_urls_in(msg);
        assert_eq!(
            got,
            "https://***@hub.example.com/rpc?api_key=***: Connection Failed: \
             Connect error: connection refused (os error 111)"
        );
        let msg = r#"two "http://a:b@h1:1" and <https://h2/?key=k> then ://nothing"#;
        assert_eq!(
            redact_urls_in(msg),
            r#"two "http://***@h1:1" and <https://h2/?key=***> then ://nothing"#
        );
        assert_eq!(redact_urls_in("no url here"), "no url here");
    }
}
