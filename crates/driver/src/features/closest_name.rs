//! The hint for a name that is not there: the names that are, and the one
//! closest to what was asked for, so a typo (`saxpyy`) is answered with the
//! fix (`saxpy`) rather than with an explanation of why it might be missing.

/// "`{lead}` `{name}`; it has: a, b, c; did you mean `b`?", the suggestion
/// left out when no name is close (more than a third of the letters differ).
pub(crate) fn no_such_name(lead: &str, name: &str, known: &[&str]) -> String {
    let mut text = format!("{lead} `{name}`; it has: {}", known.join(", "));
    if let Some(closest) = closest(name, known) {
        text.push_str(&format!("; did you mean `{closest}`?"));
    }
    text
}

/// The known name fewest edits away from `name`, if it is close enough to
/// be a typo of it.
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let (distance, best) = known
        .iter()
        .map(|candidate| (edit_distance(name, candidate), *candidate))
        .min_by_key(|(distance, _)| *distance)?;
    let allowed = name.chars().count().max(best.chars().count()).div_ceil(3);
    (distance <= allowed).then_some(best)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_answered_with_the_closest_name() {
        let known = ["saxpy", "scale_f32", "fill_f32"];
        assert_eq!(
            no_such_name("the module has no kernel named", "saxpyy", &known),
            "the module has no kernel named `saxpyy`; it has: saxpy, scale_f32, fill_f32; \
             did you mean `saxpy`?"
        );
        assert_eq!(closest("fill_f64", &known), Some("fill_f32"));
    }

    #[test]
    fn a_name_unlike_any_gets_no_suggestion() {
        assert_eq!(closest("nowhere", &["saxpy", "scale"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
