//! The one message for a key the configuration does not have, wherever it is found (the
//! agent's TOML through serde, MindIE's `user_config.json` by hand): the key, the nearest
//! known key when one is close enough to be a typo, then every known key.

/// `unknown key `key`; did you mean `near`? (known keys: a, b, c)`.
pub(crate) fn message(key: &str, known: &[&str]) -> String {
    let list = if known.is_empty() {
        "this table has no keys".to_owned()
    } else {
        format!("known keys: {}", known.join(", "))
    };
    match nearest(key, known) {
        Some(near) => format!("unknown key `{key}`; did you mean `{near}`? ({list})"),
        None => format!("unknown key `{key}` ({list})"),
    }
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (or "expected `a`", or "there are
/// no fields") in the form of [`message`]; any other message unchanged.
pub(crate) fn rewrite_serde(msg: &str) -> String {
    let Some(rest) = msg.strip_prefix("unknown field `") else {
        return msg.to_owned();
    };
    let Some((key, expected)) = rest.split_once('`') else {
        return msg.to_owned();
    };
    let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    message(key, &known)
}

/// The known key nearest to `key` if it is a likely typo: at most 2 edits (1 for keys of up
/// to 4 characters), ties to the first.
pub(crate) fn nearest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = if key.chars().count() <= 4 { 1 } else { 2 };
    known
        .iter()
        .map(|k| (distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, with a swap of two neighbours counting as one edit.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_the_nearest_key_for_a_typo_only() {
        let known = ["sample_period", "admin_listen", "policy"];
        assert_eq!(
            message("sample_periood", &known),
            "unknown key `sample_periood`; did you mean `sample_period`? (known keys: sample_period, admin_listen, policy)"
        );
        assert_eq!(nearest("polcy", &known), Some("policy"));
        assert_eq!(nearest("adminlisten", &known), Some("admin_listen"));
        assert_eq!(nearest("bogus", &known), None);
        assert_eq!(
            message("bogus", &known),
            "unknown key `bogus` (known keys: sample_period, admin_listen, policy)"
        );
        // Transposed letters are one edit.
        assert_eq!(nearest("pcliyo", &["policy"]), None);
        assert_eq!(nearest("poilcy", &["policy"]), Some("policy"));
    }

    #[test]
    fn serde_messages_take_the_same_form() {
        assert_eq!(
            rewrite_serde("unknown field `agnt`, expected one of `agent`, `engine`"),
            "unknown key `agnt`; did you mean `agent`? (known keys: agent, engine)"
        );
        assert_eq!(
            rewrite_serde("unknown field `x`, expected `period`"),
            "unknown key `x` (known keys: period)"
        );
        assert_eq!(
            rewrite_serde("unknown field `x`, there are no fields"),
            "unknown key `x` (this table has no keys)"
        );
        assert_eq!(
            rewrite_serde("invalid type: string"),
            "invalid type: string"
        );
    }
}
