//! Reading `/proc/<pid>/stat`: the runner's checks of the processes it starts (alive, their
//! session, their nice).

/// Field `n` (1-based, as proc(5) numbers them; `n` ≥ 3) of `pid`'s `/proc/<pid>/stat`;
/// `None` when the process is gone or the field is not a `T`.
pub fn stat_field<T: std::str::FromStr>(pid: u32, n: usize) -> Option<T> {
    field(
        &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
        n,
    )
}

/// Field `n` of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and
/// may itself hold spaces and parentheses: fields are counted from the last `)`.
fn field<T: std::str::FromStr>(stat: &str, n: usize) -> Option<T> {
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 30 -10 3 0 99";
        assert_eq!(field::<String>(stat, 3).as_deref(), Some("S"));
        assert_eq!(field::<i32>(stat, 19), Some(-10));
        assert_eq!(field::<u32>(stat, 6), Some(4242));
        assert_eq!(field::<i32>("4242 (cut short) S 1", 19), None);
        assert_eq!(field::<i32>("no parentheses", 19), None);
        assert_eq!(field::<i32>("1 (x)", 19), None);
        assert_eq!(field::<i32>(stat, 2), None);
    }

    #[test]
    fn this_process_is_read_and_a_gone_one_is_none() {
        let me = std::process::id();
        assert_eq!(
            stat_field::<u32>(me, 4),
            Some(std::os::unix::process::parent_id())
        );
        assert_eq!(stat_field::<u32>(u32::MAX, 3), None);
    }
}
