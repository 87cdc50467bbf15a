//! What the software driver can say about a CUDA source without a
//! compiler: whether its brackets balance. It has no NVRTC to compile the
//! source, so without one this is the whole check; a source that passes it
//! may still not compile (see docs/kernels.md for a real check without a
//! GPU: NVRTC from pip).

use super::parse;

/// The first unbalanced `(`, `[` or `{` of `source` (outside comments,
/// strings and preprocessor lines), as a log line naming the lines.
///
/// ```text
/// `}` on line 4 closes `(` opened on line 2
/// ```
pub(crate) fn bracket_problem(source: &str) -> Option<String> {
    let mut open: Vec<(char, usize)> = Vec::new();
    for (c, line) in parse::punctuation_lines(source) {
        match c {
            '(' | '[' | '{' => open.push((c, line)),
            ')' | ']' | '}' => match open.pop() {
                Some((opener, _)) if closer(opener) == c => {}
                Some((opener, at)) => {
                    return Some(format!(
                        "`{c}` on line {line} closes `{opener}` opened on line {at}, \
                         which `{}` should close",
                        closer(opener)
                    ));
                }
                None => return Some(format!("`{c}` on line {line} closes nothing")),
            },
            _ => {}
        }
    }
    open.pop().map(|(opener, at)| {
        format!(
            "`{opener}` opened on line {at} is never closed (`{}` missing)",
            closer(opener)
        )
    })
}

fn closer(opener: char) -> char {
    match opener {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_source_passes_whatever_its_comments_and_strings_hold() {
        let source = r#"
            // a comment with ( and {
            #define OPEN (
            extern "C" __global__ void k(float* y) { const char* s = "}"; y[0] = 1.0f; }
            /* ] */
        "#;
        assert_eq!(bracket_problem(source), None);
    }

    #[test]
    fn each_kind_of_imbalance_is_named_with_its_lines() {
        assert_eq!(
            bracket_problem("void k() {\n  y[0 = 1;\n}\n").as_deref(),
            Some("`}` on line 3 closes `[` opened on line 2, which `]` should close")
        );
        assert_eq!(
            bracket_problem("void k() {\n  y = 1;\n").as_deref(),
            Some("`{` opened on line 1 is never closed (`}` missing)")
        );
        assert_eq!(
            bracket_problem("void k() {}\n}").as_deref(),
            Some("`}` on line 2 closes nothing")
        );
    }
}
