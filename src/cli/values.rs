//! The values of `--role` and `--policy`. Their words live in the wire crate, which has no
//! clap, so clap cannot derive a value enum for them; these parsers list the same names and
//! the same help as the derive did.

use crate::config::mindie::Role;
use crate::config::policy::Policy;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

/// `--role`: every role, by its name.
pub(super) fn role() -> impl TypedValueParser<Value = Role> {
    PossibleValuesParser::new(Role::ALL.map(|r| PossibleValue::new(r.as_str()))).map(|name| {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == name)
            .unwrap_or(Role::Union)
    })
}

/// `--policy`: every policy, by its name, with what it does.
pub(super) fn policy() -> impl TypedValueParser<Value = Policy> {
    PossibleValuesParser::new(Policy::ALL.map(|p| PossibleValue::new(p.as_str()).help(help(p))))
        .map(|name| {
            Policy::ALL
                .into_iter()
                .find(|p| p.as_str() == name)
                .unwrap_or_default()
        })
}

/// What `policy` does, in `--help`'s list of values.
fn help(policy: Policy) -> &'static str {
    match policy {
        Policy::Reference => "MindIE V5 virtual inference, exactly",
        Policy::Agent => {
            "Stall detection, QoS eviction, fast confirmation and the `/health` grace. The default: it passed the chaos suite (both Node Manager cadences, fake and real engine) and MindIE PyMotor's own Node Manager (docs/policy.md)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{policy, role};
    use crate::config::mindie::Role;
    use crate::config::policy::Policy;

    #[test]
    fn every_role_and_policy_parses_from_its_name_and_nothing_else_does() {
        let cmd = clap::Command::new("t");
        let arg = clap::Arg::new("x");
        for r in Role::ALL {
            let got = clap::builder::TypedValueParser::parse_ref(
                &role(),
                &cmd,
                Some(&arg),
                r.as_str().as_ref(),
            );
            assert_eq!(got.unwrap(), r);
        }
        for p in Policy::ALL {
            let got = clap::builder::TypedValueParser::parse_ref(
                &policy(),
                &cmd,
                Some(&arg),
                p.as_str().as_ref(),
            );
            assert_eq!(got.unwrap(), p);
        }
        let bad = clap::builder::TypedValueParser::parse_ref(
            &policy(),
            &cmd,
            Some(&arg),
            "strict".as_ref(),
        );
        assert!(bad.is_err());
    }
}
