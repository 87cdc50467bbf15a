//! The disk cache of compiled programs: one file per key (source, options,
//! name expressions, architecture, output kind and NVRTC version), holding
//! the whole key, so a hash collision is a miss and never a wrong image.
//!
//! Where: `CUDA_STREAMS_KERNEL_CACHE` names the directory, or `off` turns the
//! cache off; unset, it is `$XDG_CACHE_HOME/cuda-streams/kernels`, else
//! `$HOME/.cache/cuda-streams/kernels`. A cache that cannot be read or
//! written is skipped (a `tracing` warning), never an error.
//!
//! The directory may be shared, so nothing in it is taken on faith:
//! - an entry carries the SHA-256 of its contents, checked on every read; an
//!   entry that fails (truncated, corrupted) is removed, with a warning, and
//!   the program compiled again;
//! - links are never followed: an entry is opened with `O_NOFOLLOW`, so a
//!   link planted at its name is a miss, and replaced (not written through)
//!   when the entry is stored;
//! - an entry is written to a new file of an unpredictable name in the same
//!   directory (`O_CREAT | O_EXCL`, which fails on anything already there,
//!   a link included), then renamed into place, so a reader sees a whole
//!   entry or none, and concurrent writers each rename a whole file.
//!
//! The hash detects damage, not intent: whoever can write the directory can
//! store any image under any key, so share it only among users who trust
//! each other's kernels.

use sha2::{Digest, Sha256};
use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
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

/// Version 2: the contents follow their SHA-256.
const MAGIC: &[u8] = b"cuda-streams kernel cache 2\n";

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

/// The entry stored under `key` in `dir`, if there is one for exactly it,
/// whole and undamaged.
pub(crate) fn load(dir: &Path, key: &str) -> Option<Entry> {
    let path = dir.join(file_name(key));
    let bytes = match read_no_follow(&path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => {
            tracing::warn!(
                "kernel cache: not reading {} (a link, or unreadable): {err}",
                path.display()
            );
            return None;
        }
    };
    let Some(contents) = verified(&bytes) else {
        tracing::warn!(
            "kernel cache: {} is damaged (its SHA-256 does not match); removing it, the \
             program is compiled again",
            path.display()
        );
        // Only a regular file was read (no link), so this removes the entry
        // itself; a writer may have replaced it meanwhile, and then a whole
        // entry is lost, not a wrong one kept.
        let _ = std::fs::remove_file(&path);
        return None;
    };
    let mut input = contents;
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

/// The contents of a stored file whose hash matches them.
fn verified(bytes: &[u8]) -> Option<&[u8]> {
    let rest = bytes.strip_prefix(MAGIC)?;
    let (hash, contents) = rest.split_at_checked(32)?;
    (Sha256::digest(contents).as_slice() == hash).then_some(contents)
}

/// Read the regular file at `path`, refusing a link there.
fn read_no_follow(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    #[cfg(not(unix))]
    if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(std::io::Error::other("a symbolic link"));
    }
    let mut file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Create `path` as a new file, never opening anything already there (a
/// link included), and write `bytes` to it.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW).mode(0o644);
    }
    let mut file: File = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_data()
}

/// A temporary name no other writer (or planter) can know beforehand:
/// randomly keyed per process, and counted.
fn temporary_name(final_name: &str) -> String {
    static UNIQUE: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(UNIQUE.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    format!(
        ".{final_name}.{}.{:016x}.tmp",
        std::process::id(),
        hasher.finish()
    )
}

/// Store `entry` under `key` in `dir`: written to a new file beside it,
/// then renamed into place, so a reader never sees half an entry.
pub(crate) fn store(dir: &Path, key: &str, entry: &Entry) {
    let mut contents = Vec::new();
    put(&mut contents, key.as_bytes());
    contents.extend_from_slice(&(entry.lowered.len() as u64).to_le_bytes());
    for (expression, lowered) in &entry.lowered {
        put(&mut contents, expression.as_bytes());
        put(&mut contents, lowered.as_bytes());
    }
    put(&mut contents, entry.log.as_bytes());
    put(&mut contents, &entry.image);
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&Sha256::digest(&contents));
    out.extend_from_slice(&contents);
    let name = file_name(key);
    let path = dir.join(&name);
    if let Err(err) = std::fs::create_dir_all(dir) {
        tracing::warn!("kernel cache: cannot create {}: {err}", dir.display());
        return;
    }
    // A name taken already (by chance, or planted) is skipped, never opened.
    let mut last = None;
    for _ in 0..4 {
        let temporary = dir.join(temporary_name(&name));
        match write_new(&temporary, &out) {
            Ok(()) => {
                // rename replaces whatever is at `path` (a link itself, not
                // its target).
                if let Err(err) = std::fs::rename(&temporary, &path) {
                    let _ = std::fs::remove_file(&temporary);
                    tracing::warn!("kernel cache: cannot write {}: {err}", path.display());
                }
                return;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => last = Some(err),
            Err(err) => {
                let _ = std::fs::remove_file(&temporary);
                last = Some(err);
                break;
            }
        }
    }
    if let Some(err) = last {
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

    /// A fresh directory of this test's own.
    fn fresh(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kernel-cache-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entry(byte: u8) -> Entry {
        Entry {
            image: vec![byte; 4096],
            log: format!("log {byte}"),
            lowered: vec![("k".into(), format!("lowered {byte}"))],
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_link_planted_at_an_entry_is_neither_read_nor_written_through() {
        let dir = fresh("link");
        let target = dir.join("victim");
        std::fs::write(&target, b"precious").unwrap();
        let path = dir.join(file_name("key"));
        std::os::unix::fs::symlink(&target, &path).unwrap();

        assert_eq!(load(&dir, "key"), None);
        store(&dir, "key", &entry(1));
        // The link was replaced by the entry; its target is untouched.
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert!(
            !std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(load(&dir, "key"), Some(entry(1)));

        // A link to a whole, valid entry elsewhere is refused all the same.
        let elsewhere = fresh("link-elsewhere");
        store(&elsewhere, "other", &entry(2));
        let linked = dir.join(file_name("other"));
        std::os::unix::fs::symlink(elsewhere.join(file_name("other")), &linked).unwrap();
        assert_eq!(load(&elsewhere, "other"), Some(entry(2)));
        assert_eq!(load(&dir, "other"), None);
        std::fs::remove_dir_all(&elsewhere).unwrap();

        // A link where a new file is to be created is never opened.
        let planted = dir.join("planted.tmp");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let err = write_new(&planted, b"overwritten").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporary_names_are_not_predictable() {
        let a = temporary_name("x.bin");
        let b = temporary_name("x.bin");
        assert_ne!(a, b);
        // Beyond the process id, 64 bits keyed by the process's random state.
        let random = |name: &str| name.rsplit('.').nth(1).unwrap().to_string();
        assert_eq!(random(&a).len(), 16);
        assert_ne!(random(&a), random(&b));
    }

    #[test]
    fn a_damaged_entry_is_removed_and_not_returned() {
        let dir = fresh("damaged");
        store(&dir, "key", &entry(7));
        let path = dir.join(file_name("key"));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1; // one bit of the image
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&dir, "key"), None);
        assert!(!path.exists(), "the damaged entry is removed");
        // Truncated: the same.
        store(&dir, "key", &entry(7));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(load(&dir, "key"), None);
        // Stored again, it is read again.
        store(&dir, "key", &entry(7));
        assert_eq!(load(&dir, "key"), Some(entry(7)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_writers_and_readers_see_whole_entries_only() {
        let dir = fresh("concurrent");
        let writers: Vec<_> = (0..4u8)
            .map(|w| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        store(&dir, "key", &entry(w));
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let mut seen = 0;
                    for _ in 0..200 {
                        if let Some(found) = load(&dir, "key") {
                            // Whole, and one writer's: never a mixture.
                            assert!((0..4).any(|w| found == entry(w)), "{:?}", found.log);
                            seen += 1;
                        }
                    }
                    seen
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        for reader in readers {
            reader.join().unwrap();
        }
        let found = load(&dir, "key").expect("an entry after the writers");
        assert!((0..4).any(|w| found == entry(w)));
        // Every temporary was renamed into place: only the entry is left.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(file_name("key"))]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
