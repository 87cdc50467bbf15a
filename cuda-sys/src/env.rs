//! Settings read from environment variables: one parser for every crate.
//!
//! Each setting has our name (`CUDA_STREAMS_…`) and may have other names for
//! the same thing, such as the names of the specification the pipeline
//! follows (`MAX_CONCURRENT_CUDA_STREAMS`). The first name that is set wins,
//! so **ours win when both are set**. A value that does not parse, or is out
//! of range, is an [`EnvError`] naming the variable and the value; nothing
//! falls back to a default silently.
//!
//! ```
//! use cuda_streams_sys::env::{Setting, Source};
//! const STREAMS: Setting = Setting {
//!     name: "CUDA_STREAMS_MAX_STREAMS",
//!     aliases: &["MAX_CONCURRENT_CUDA_STREAMS"],
//!     default: "4",
//!     about: "the most streams",
//! };
//! // Only the other name is set: it is used.
//! let only_seed = |var: &str| (var == "MAX_CONCURRENT_CUDA_STREAMS").then(|| "3".to_string());
//! let found = STREAMS.lookup(only_seed).unwrap().unwrap();
//! assert_eq!((found.var, found.value.as_str()), ("MAX_CONCURRENT_CUDA_STREAMS", "3"));
//! assert_eq!(found.source(), Source::Alias("MAX_CONCURRENT_CUDA_STREAMS"));
//! assert_eq!(found.parse_int::<usize>(1..=64).unwrap(), 3);
//! // Both set: ours wins, and the other is recorded as overridden.
//! let both = |var: &str| Some(if var == "CUDA_STREAMS_MAX_STREAMS" { "2" } else { "3" }.to_string());
//! let found = STREAMS.lookup(both).unwrap().unwrap();
//! assert_eq!((found.var, found.overridden.as_slice()), ("CUDA_STREAMS_MAX_STREAMS", &["MAX_CONCURRENT_CUDA_STREAMS"][..]));
//! // A bad value names the variable and the value.
//! let bad = |var: &str| (var == "CUDA_STREAMS_MAX_STREAMS").then(|| "lots".to_string());
//! let err = STREAMS.lookup(bad).unwrap().unwrap().parse_int::<usize>(1..=64).unwrap_err();
//! assert_eq!(err.to_string(), "environment variable CUDA_STREAMS_MAX_STREAMS=\"lots\" is invalid: \
//!                              expected a whole number from 1 to 64");
//! ```

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::str::FromStr;

/// A value read from the environment that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {var}={value:?} is invalid: {reason}")]
pub struct EnvError {
    /// The variable that held it (ours or another name of the same setting).
    pub var: &'static str,
    /// The value found (lossily decoded when it is not UTF-8).
    pub value: String,
    /// What is wrong with it, and what is expected.
    pub reason: String,
}

/// One setting the library reads from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Our name, which wins over every alias.
    pub name: &'static str,
    /// Other names of the same setting, in order of precedence.
    pub aliases: &'static [&'static str],
    /// The value used when no name is set, as a person would write it.
    pub default: &'static str,
    /// What it sets, in a few words.
    pub about: &'static str,
}

/// Where a setting's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Our own variable.
    Ours(&'static str),
    /// Another name of the setting (ours was not set).
    Alias(&'static str),
}

/// A setting found in the environment: which variable held it, and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The setting.
    pub setting: Setting,
    /// The variable the value came from.
    pub var: &'static str,
    /// The value, untrimmed.
    pub value: String,
    /// Other names of the setting that were set too, and lost to `var`.
    pub overridden: Vec<&'static str>,
}

impl Setting {
    /// Every name, ours first.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + use<> {
        std::iter::once(self.name).chain(self.aliases.iter().copied())
    }

    /// Read the setting from the process environment: `None` when no name is
    /// set. A value that is not UTF-8 is an error naming the variable.
    pub fn from_env(&self) -> Result<Option<Found>, EnvError> {
        self.find(|var| match std::env::var(var) {
            Ok(value) => Ok(Some(value)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(raw)) => Err(EnvError {
                var,
                value: raw.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".into(),
            }),
        })
    }

    /// [`from_env`](Self::from_env) with the variables read through `lookup`
    /// (for tests and for callers that keep their own environment).
    pub fn lookup(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Found>, EnvError> {
        self.find(|var| Ok(lookup(var)))
    }

    fn find(
        &self,
        get: impl Fn(&'static str) -> Result<Option<String>, EnvError>,
    ) -> Result<Option<Found>, EnvError> {
        let mut found: Option<Found> = None;
        for var in self.names() {
            let Some(value) = get(var)? else { continue };
            match &mut found {
                Some(winner) => winner.overridden.push(var),
                None => {
                    found = Some(Found {
                        setting: *self,
                        var,
                        value,
                        overridden: Vec::new(),
                    })
                }
            }
        }
        Ok(found)
    }
}

impl Found {
    /// Whether the value came from our name or another one.
    pub fn source(&self) -> Source {
        if self.var == self.setting.name {
            Source::Ours(self.var)
        } else {
            Source::Alias(self.var)
        }
    }

    /// An error naming this variable and value, for checks the parsers here
    /// do not make.
    pub fn error(&self, reason: impl Into<String>) -> EnvError {
        EnvError {
            var: self.var,
            value: self.value.clone(),
            reason: reason.into(),
        }
    }

    /// A whole number in `range` (surrounding spaces allowed), e.g. `1..=64`
    /// or `1..`.
    pub fn parse_int<T>(&self, range: impl RangeBounds<T>) -> Result<T, EnvError>
    where
        T: FromStr + PartialOrd + fmt::Display,
    {
        let expected = || match (range.start_bound(), range.end_bound()) {
            (Bound::Included(min), Bound::Included(max)) => {
                format!("expected a whole number from {min} to {max}")
            }
            (Bound::Included(min), Bound::Unbounded) => {
                format!("expected a whole number, at least {min}")
            }
            _ => "expected a whole number in range".to_string(),
        };
        let n = self
            .value
            .trim()
            .parse::<T>()
            .map_err(|_| self.error(expected()))?;
        if range.contains(&n) {
            Ok(n)
        } else {
            Err(self.error(expected()))
        }
    }

    /// A finite number, at least `min` (surrounding spaces allowed).
    pub fn parse_number(&self, min: f64) -> Result<f64, EnvError> {
        let expected = || format!("expected a finite number, {min} or more (e.g. 100 or 12.5)");
        let n = self
            .value
            .trim()
            .parse::<f64>()
            .map_err(|_| self.error(expected()))?;
        if n.is_finite() && n >= min {
            Ok(n)
        } else {
            Err(self.error(expected()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Setting = Setting {
        name: "OURS",
        aliases: &["SEED", "OTHER"],
        default: "8",
        about: "test",
    };

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn unset_is_none_and_the_first_name_set_wins() {
        assert_eq!(S.lookup(env(&[])).unwrap(), None);
        let f = S
            .lookup(env(&[("OTHER", "1"), ("SEED", "2")]))
            .unwrap()
            .unwrap();
        assert_eq!((f.var, f.value.as_str()), ("SEED", "2"));
        assert_eq!(f.overridden, ["OTHER"]);
        assert_eq!(f.source(), Source::Alias("SEED"));
        let f = S
            .lookup(env(&[("OTHER", "1"), ("OURS", "3"), ("SEED", "2")]))
            .unwrap()
            .unwrap();
        assert_eq!((f.var, f.value.as_str()), ("OURS", "3"));
        assert_eq!(f.overridden, ["SEED", "OTHER"]);
        assert_eq!(f.source(), Source::Ours("OURS"));
    }

    #[test]
    fn bad_values_name_the_variable_that_held_them() {
        for (pairs, range, message) in [
            (
                &[("SEED", "abc")][..],
                1..=64,
                "environment variable SEED=\"abc\" is invalid: expected a whole number from 1 to 64",
            ),
            (&[("OURS", "0")][..], 1..=64, "OURS=\"0\""),
            (&[("OURS", "65")][..], 1..=64, "OURS=\"65\""),
            (&[("OURS", "-1")][..], 0..=64, "OURS=\"-1\""),
            (&[("OURS", "")][..], 0..=64, "OURS=\"\""),
        ] {
            let pairs: &'static [(&'static str, &'static str)] = pairs;
            let f = S.lookup(env(pairs)).unwrap().unwrap();
            let err = f.parse_int::<i64>(range).unwrap_err().to_string();
            assert!(err.contains(message), "{err}");
        }
        let f = S.lookup(env(&[("OURS", "0")])).unwrap().unwrap();
        let err = f.parse_int::<u64>(1..).unwrap_err().to_string();
        assert!(
            err.ends_with("expected a whole number, at least 1"),
            "{err}"
        );
        assert_eq!(
            S.lookup(env(&[("OURS", " 12 ")]))
                .unwrap()
                .unwrap()
                .parse_int(1..=64u32)
                .unwrap(),
            12
        );
    }

    #[test]
    fn numbers_must_be_finite_and_at_least_the_minimum() {
        let parse = |v: &'static str| {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([("OURS", v)]));
            S.lookup(env(pairs)).unwrap().unwrap().parse_number(0.0)
        };
        assert_eq!(parse("12.5").unwrap(), 12.5);
        assert_eq!(parse("0").unwrap(), 0.0);
        for bad in ["-1", "NaN", "inf", "x"] {
            let err = parse(bad).unwrap_err();
            assert_eq!((err.var, err.value.as_str()), ("OURS", bad));
        }
    }
}
