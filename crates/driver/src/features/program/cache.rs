//! The disk cache of compiled programs: one file per key (source, options,
//! name expressions, architecture, output kind and NVRTC version), holding
//! the whole key, so a hash collision is a miss and never a wrong image.
//!
//! Where: `CUDA_STREAMS_KERNEL_CACHE` names the directory, or `off` turns the
//! cache off; unset, it is `$XDG_CACHE_HOME/cuda-streams/kernels`, else
//! `$HOME/.cache/cuda-streams/kernels`. A cache that cannot be read or
//! written is skipped (a `tracing` warning), never an error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that places or disables the cache.
pub const CACHE_ENV: &str = "CUDA_STREAMS_KERNEL_CACHE";

/// [`CACHE_ENV`] as a setting (for listings such as `cuda-streams info`).
pub const CACHE_SETTING: sys::env::Setting = sys::env::Setting {
    name: CACHE_ENV,
    aliases: &[],
    default: "$XDG_CACHE_HOME/cuda-streams/kernels",
    about: "where compiled CUDA programs are cached; `off` compiles every time",
};

const MAGIC: &[u8] = b"cuda-streams kernel cache 1\n";

/// The cache directory the environment selects, or `None` when it is off.
pub(crate) fn default_dir() -> Option<PathBuf> {
    match std::env::var_os(CACHE_ENV) {
        Some(value) if matches!(value.to_str(), Some("off" | "0" | "false" | "no")) => None,
        Some(value) if !value.is_empty() => Some(PathBuf::from(value)),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("cuda-streams").join("kernels"))
        }
    }
}

/// What a cache entry holds besides its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) image: Vec<u8>,
    pub(crate) log: String,
    pub(crate) lowered: Vec<(String, String)>,
}

/// 128-bit FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
fn file_name(key: &str) -> String {
    let mut hash: u128 = 0x6c62272e07bb014262b821756295c58d;
    for byte in key.as_bytes() {
        hash ^= u128::from(*byte);
        hash = hash.wrapping_mul(0x0000000001000000000000000000013B);
    }
    format!("{hash:032x}.bin")
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn take<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u64::from_le_bytes(input.get(..8)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    let bytes = input.get(8..8usize.checked_add(len)?)?;
    *input = &input[8 + len..];
    Some(bytes)
}

fn text(input: &mut &[u8]) -> Option<String> {
    String::from_utf8(take(input)?.to_vec()).ok()
}

/// The entry stored under `key` in `dir`, if there is one for exactly it.
pub(crate) fn load(dir: &Path, key: &str) -> Option<Entry> {
    let bytes = std::fs::read(dir.join(file_name(key))).ok()?;
    let mut input = bytes.strip_prefix(MAGIC)?;
    if take(&mut input)? != key.as_bytes() {
        return None;
    }
    let count = u64::from_le_bytes(input.get(..8)?.try_into().ok()?);
    input = &input[8..];
    let mut lowered = Vec::new();
    for _ in 0..count {
        lowered.push((text(&mut input)?, text(&mut input)?));
    }
    let log = text(&mut input)?;
    let image = take(&mut input)?.to_vec();
    Some(Entry {
        image,
        log,
        lowered,
    })
}

/// Store `entry` under `key` in `dir`: written beside, then renamed into
/// place, so a reader never sees half an entry.
pub(crate) fn store(dir: &Path, key: &str, entry: &Entry) {
    static UNIQUE: AtomicU64 = AtomicU64::new(0);
    let mut out = MAGIC.to_vec();
    put(&mut out, key.as_bytes());
    out.extend_from_slice(&(entry.lowered.len() as u64).to_le_bytes());
    for (expression, lowered) in &entry.lowered {
        put(&mut out, expression.as_bytes());
        put(&mut out, lowered.as_bytes());
    }
    put(&mut out, entry.log.as_bytes());
    put(&mut out, &entry.image);
    let path = dir.join(file_name(key));
    let temporary = dir.join(format!(
        ".{}.{}.{}",
        file_name(key),
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&temporary, &out))
        .and_then(|()| std::fs::rename(&temporary, &path));
    if let Err(err) = written {
        let _ = std::fs::remove_file(&temporary);
        tracing::warn!("kernel cache: cannot write {}: {err}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_comes_back_only_for_its_exact_key() {
        let dir = std::env::temp_dir().join(format!("kernel-cache-unit-{}", std::process::id()));
        let entry = Entry {
            image: vec![1, 2, 3, 0],
            log: "warning: none".into(),
            lowered: vec![("scale<float>".into(), "_Z5scaleIfEvmT_PS0_".into())],
        };
        store(&dir, "key one", &entry);
        assert_eq!(load(&dir, "key one"), Some(entry.clone()));
        assert_eq!(load(&dir, "key two"), None);
        // An entry whose stored key differs (a collision) is a miss.
        std::fs::rename(
            dir.join(file_name("key one")),
            dir.join(file_name("key two")),
        )
        .unwrap();
        assert_eq!(load(&dir, "key two"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
