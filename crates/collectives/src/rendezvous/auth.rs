//! How the ranks of one job know each other at rank 0's store: a secret
//! they share, proved with HMAC-SHA256 over a fresh nonce from each side
//! before anything else crosses the socket. A replayed answer fails (the
//! other side's nonce is new), and so does a server that does not hold the
//! secret (it cannot answer the client's nonce).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a nonce.
pub(crate) const NONCE: usize = 32;
/// Bytes of a MAC (HMAC-SHA256).
pub(crate) const MAC: usize = 32;

/// The secret a job's ranks share, which each side of the launch store
/// proves it holds before the store sends anything about the job.
///
/// [`crate::Rendezvous::from_vars`] takes it from `CUDA_STREAMS_LAUNCH_TOKEN`,
/// else from the launcher's job id (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`);
/// on a loopback `MASTER_ADDR`, or with `CUDA_STREAMS_LAUNCH_INSECURE=1`,
/// a job without either uses a public secret (see
/// [`LaunchSecret::is_public`]). Its `Debug` never shows the key.
///
/// ```
/// use cuda_streams_collectives::LaunchSecret;
/// let a = LaunchSecret::from_token("f3a9c1d2e4b5");
/// assert_eq!(a, LaunchSecret::from_token("f3a9c1d2e4b5"));
/// assert_ne!(a, LaunchSecret::from_token("another job"));
/// assert!(!a.is_public());
/// assert_eq!(a.source(), "CUDA_STREAMS_LAUNCH_TOKEN");
/// assert!(!format!("{a:?}").contains("f3a9"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LaunchSecret {
    key: [u8; 32],
    source: &'static str,
    public: bool,
}

impl LaunchSecret {
    /// The secret of a token every rank was given (what
    /// `CUDA_STREAMS_LAUNCH_TOKEN` holds): use a long random one.
    pub fn from_token(token: &str) -> Self {
        Self::derived("CUDA_STREAMS_LAUNCH_TOKEN", token)
    }

    /// The secret derived from a launcher's variable (`var` names it).
    pub(crate) fn derived(var: &'static str, value: &str) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"cuda-streams launch secret v1\0");
        hash.update(var.as_bytes());
        hash.update(b"\0");
        hash.update(value.as_bytes());
        Self {
            key: hash.finalize().into(),
            source: var,
            public: false,
        }
    }

    /// The secret everyone knows: the handshake still keeps out
    /// connections that do not speak it (port scans, health checks, other
    /// programs), but not one that does. `why` says why it is used.
    pub(crate) fn public(why: &'static str) -> Self {
        Self {
            key: Sha256::digest(b"cuda-streams launch secret v1, public").into(),
            source: why,
            public: true,
        }
    }

    /// Where the secret came from: a variable's name, or why none was
    /// needed.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// Whether anyone may know it: no token and no job id was set, and the
    /// store is on loopback (other users of the host can reach it) or
    /// `CUDA_STREAMS_LAUNCH_INSECURE=1` allowed it.
    pub fn is_public(&self) -> bool {
        self.public
    }

    /// HMAC-SHA256 over `label` and `parts`. Each label's parts have fixed
    /// sizes, so their concatenation is unambiguous; labels differ, so a
    /// MAC made for one message proves nothing for another.
    pub(crate) fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; MAC] {
        self.hmac(label, parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of `label` and `parts`, compared in
    /// constant time.
    pub(crate) fn verify(&self, label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(label, parts).verify_slice(tag).is_ok()
    }

    fn hmac(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        // An HMAC takes a key of any length: this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts 32-byte keys"));
        mac.update(label);
        mac.update(b"\0");
        for part in parts {
            mac.update(part);
        }
        mac
    }
}

impl fmt::Debug for LaunchSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchSecret")
            .field("source", &self.source)
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// A fresh nonce from the operating system's CSPRNG.
pub(crate) fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut nonce = [0u8; NONCE];
    getrandom::fill(&mut nonce)
        .map_err(|err| std::io::Error::other(format!("no random bytes from the OS: {err}")))?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_the_key_the_label_and_every_byte() {
        let a = LaunchSecret::from_token("a");
        let tag = a.mac(b"server", &[&[1, 2], &[3]]);
        assert!(a.verify(b"server", &[&[1, 2], &[3]], &tag));
        assert!(!a.verify(b"client", &[&[1, 2], &[3]], &tag));
        assert!(!a.verify(b"server", &[&[1, 2], &[4]], &tag));
        assert!(!LaunchSecret::from_token("b").verify(b"server", &[&[1, 2], &[3]], &tag));
        assert!(!a.verify(b"server", &[&[1, 2], &[3]], &tag[..31]));
        // A job id and a token of the same text are different secrets.
        assert_ne!(LaunchSecret::derived("SLURM_JOB_ID", "a"), a);
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
