//! Path patterns as Docker reads them in `COPY` sources and `.dockerignore`: `/`-separated
//! segments, `*` (any run of characters but `/`), `?` (one such character), `[abc]`,
//! `[a-z]` and `[!a]` classes, `\` escapes, and a `**` segment matching any number of
//! segments (none included).

/// Whether `pattern` matches all of `path` (both relative, `/`-separated; empty segments
/// and `.` segments are ignored in both).
pub fn matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = segments(pattern).collect();
    let path: Vec<&str> = segments(path).collect();
    match_segments(&pattern, &path)
}

/// Whether `pattern` matches `path` or one of its parent directories (`app` covers
/// `app/src/main.py`).
pub fn matches_or_parent(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = segments(pattern).collect();
    let path: Vec<&str> = segments(path).collect();
    (1..=path.len()).any(|n| match_segments(&pattern, &path[..n]))
}

fn segments(text: &str) -> impl Iterator<Item = &str> {
    text.split('/').filter(|s| !s.is_empty() && *s != ".")
}

fn match_segments(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| match_segments(rest, &path[skip..])),
        Some((first, rest)) => match path.split_first() {
            Some((segment, tail)) => {
                match_segment(first.as_bytes(), segment.as_bytes()) && match_segments(rest, tail)
            }
            None => false,
        },
    }
}

/// One segment against one name (no `/` in either).
fn match_segment(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| match_segment(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && match_segment(rest, &name[1..]),
        Some((b'[', rest)) => {
            let Some((&c, tail)) = name.split_first() else {
                return false;
            };
            match class(rest, c) {
                Some((true, after)) => match_segment(after, tail),
                _ => false,
            }
        }
        Some((b'\\', rest)) if !rest.is_empty() => {
            name.first() == Some(&rest[0]) && match_segment(&rest[1..], &name[1..])
        }
        Some((&p, rest)) => name.first() == Some(&p) && match_segment(rest, &name[1..]),
    }
}

/// A `[...]` class (after its `[`) against `c`: whether it matched, and what follows the
/// class. `None` for a class without its `]`.
fn class(pattern: &[u8], c: u8) -> Option<(bool, &[u8])> {
    let (negated, mut rest) = match pattern.first() {
        Some(b'!' | b'^') => (true, &pattern[1..]),
        _ => (false, pattern),
    };
    let mut found = false;
    let mut first = true;
    loop {
        let (&item, after) = rest.split_first()?;
        if item == b']' && !first {
            return Some((found != negated, after));
        }
        first = false;
        let (low, after) = if item == b'\\' {
            let (&escaped, after) = after.split_first()?;
            (escaped, after)
        } else {
            (item, after)
        };
        if after.first() == Some(&b'-') && after.get(1).is_some_and(|b| *b != b']') {
            let high = after[1];
            found |= (low..=high).contains(&c);
            rest = &after[2..];
        } else {
            found |= low == c;
            rest = after;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_glob_segments_and_classes() {
        assert!(matches("app", "app"));
        assert!(matches("./app/", "app"));
        assert!(!matches("app", "app/main.py"));
        assert!(matches_or_parent("app", "app/main.py"));
        assert!(matches("*.py", "main.py"));
        assert!(!matches("*.py", "src/main.py"), "* stays in its segment");
        assert!(matches("**/*.py", "src/deep/main.py"));
        assert!(matches("**/*.py", "main.py"), "** matches no segment too");
        assert!(matches("src/**", "src/a/b"));
        assert!(matches("file?.txt", "file1.txt"));
        assert!(!matches("file?.txt", "file10.txt"));
        assert!(matches("[a-c]x", "bx"));
        assert!(!matches("[!a-c]x", "bx"));
        assert!(matches("[]]", "]"));
        assert!(matches(r"a\*b", "a*b"));
        assert!(!matches(r"a\*b", "axb"));
        assert!(!matches("[ab", "a"), "an unclosed class matches nothing");
        assert!(matches("*", "anything"));
    }
}
