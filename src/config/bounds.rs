//! Bounds: the inclusive range a setting must lie in ([`Within`]), stated in the message of
//! the error that refuses a value outside it. Each table's bounds live beside the type they
//! check (`qos::bounds`, `policy::bounds`, …).

use super::KeyError;
use std::time::Duration;

/// An inclusive range a setting must lie in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Within<T> {
    pub min: T,
    pub max: T,
}

/// How a value of a bounded setting is shown in messages.
pub trait Shown: Copy + PartialOrd {
    fn shown(self) -> String;
}

impl Shown for Duration {
    fn shown(self) -> String {
        humantime::format_duration(self).to_string()
    }
}

impl Shown for f64 {
    fn shown(self) -> String {
        // Whole numbers without a fraction (`100`, not `100.0`); the rest as Rust writes them
        // shortest (`1e300`, `NaN`, `-0.5`).
        if self.is_finite() && self.fract() == 0.0 && self.abs() < 1e15 {
            format!("{}", self as i64)
        } else {
            format!("{self:?}")
        }
    }
}

macro_rules! shown_int {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(self) -> String {
                self.to_string()
            }
        }
    )*};
}
shown_int!(u16, u32, u64, usize, i64);

impl<T: Shown> Within<T> {
    /// The range `min..=max`.
    pub(crate) const fn new(min: T, max: T) -> Within<T> {
        Within { min, max }
    }

    /// Whether `v` lies in the range (never for NaN).
    pub(crate) fn contains(self, v: T) -> bool {
        v >= self.min && v <= self.max
    }

    /// `Err((key, "`v` is outside min..=max"))` unless `v` lies in the range.
    pub(crate) fn check(self, key: &str, v: T) -> Result<(), KeyError> {
        if self.contains(v) {
            Ok(())
        } else {
            Err((key.to_owned(), format!("`{}` is outside {self}", v.shown())))
        }
    }

    /// `v` moved into the range (for generated configs, such as the chaos runner's).
    pub fn clamp(self, v: T) -> T {
        if v < self.min {
            self.min
        } else if v > self.max {
            self.max
        } else {
            v
        }
    }
}

impl<T: Shown> std::fmt::Display for Within<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.min.shown(), self.max.shown())
    }
}

pub(crate) const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
