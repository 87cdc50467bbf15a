//! The random token that authenticates the two ends of an [`IpcChannel`](super::IpcChannel).

use crate::ground::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// 16 random bytes that an exporter makes and hands to the processes it
/// trusts (in an environment variable, a command line, a file only they
/// read): an [`IpcListener`](super::IpcListener) accepts only a peer that
/// presents it, and every message on the channel carries it.
///
/// It is shown and parsed as 32 lowercase hex digits.
///
/// ```
/// use cuda_streams_driver::IpcToken;
/// let token = IpcToken::random().unwrap();
/// let text = token.to_string();
/// assert_eq!(text.len(), 32);
/// assert_eq!(text.parse::<IpcToken>().unwrap(), token);
/// let err = "not hex".parse::<IpcToken>().unwrap_err();
/// assert!(err.to_string().contains("\"not hex\""), "{err}");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcToken(pub(crate) [u8; 16]);

impl IpcToken {
    /// A fresh token from the kernel's random source (`getrandom`).
    pub fn random() -> Result<Self> {
        let mut bytes = [0u8; 16];
        let mut filled = 0;
        while filled < bytes.len() {
            // SAFETY: writes at most `16 - filled` bytes into the rest of a
            // local buffer of that size.
            let got = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
            };
            if got <= 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Ipc {
                    reason: format!("no random bytes for a token: {err}"),
                });
            }
            filled += got as usize;
        }
        Ok(Self(bytes))
    }

    /// Compare in constant time, so a peer cannot learn the token byte by
    /// byte from how fast it is refused.
    pub(crate) fn matches(&self, other: &[u8; 16]) -> bool {
        self.0
            .iter()
            .zip(other)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }
}

impl fmt::Display for IpcToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Never printed whole: a log line must not leak it.
impl fmt::Debug for IpcToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcToken({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

impl FromStr for IpcToken {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = || Error::Ipc {
            reason: format!("{text:?} is not a token: a token is 32 hex digits"),
        };
        if text.len() != 32 || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }
}
