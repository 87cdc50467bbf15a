//! Which NCCL runs a context's collectives: the software NCCL on the software
//! driver, `libnccl.so.2` on a GPU (loaded once).

use crate::error::{Error, Result};
use driver::{Context, DriverKind};
use std::sync::OnceLock;
use sys::env::Setting;
use sys::nccl::Nccl;

/// The NCCL table for contexts of `kind`.
pub(crate) fn nccl(kind: DriverKind) -> Result<&'static Nccl> {
    match kind {
        DriverKind::Soft => Ok(soft_driver::nccl()),
        DriverKind::Cuda => {
            static LOADED: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
            LOADED
                .get_or_init(|| {
                    require_nvls_choice().map_err(|err| err.to_string())?;
                    Nccl::load().map_err(|err| err.to_string())
                })
                .as_ref()
                .map_err(|err| Error::Load(err.clone()))
        }
    }
}

/// The NCCL table for `ctx`.
pub(crate) fn for_context(ctx: &Context) -> Result<&'static Nccl> {
    nccl(ctx.kind())
}

/// `NCCL_NVLS_ENABLE`: whether NCCL may use NVLink SHARP (multicast
/// objects). Required on GPUs, read before NCCL is loaded.
pub const NVLS_ENABLE: Setting = Setting {
    name: "NCCL_NVLS_ENABLE",
    aliases: &[],
    default: "(required on GPUs: 0 keeps NVLink SHARP off)",
    about: "whether NCCL may use NVLink SHARP multicast: 0 off, 1 on, 2 NCCL's own choice",
};

/// NCCL reads `NCCL_NVLS_ENABLE` from the process environment when a
/// communicator is made, and offers no other switch (`ncclConfig_t`'s
/// `nvlsCTAs` sizes NVLS, it does not turn it off). Writing the environment
/// here would be unsound: by the time NCCL is loaded the CUDA driver's own
/// threads run, and C code may call `getenv` on them while `setenv`
/// reallocates the environment. So the choice is the user's, made before
/// the program starts; NVLink SHARP is never turned on by default, because
/// on hosts whose GPUs others share a program that uses it can take the
/// GPUs out of service.
fn require_nvls_choice() -> Result<(), sys::env::EnvError> {
    let enabled = nvls_choice(NVLS_ENABLE.from_env()?)?;
    tracing::info!("NCCL_NVLS_ENABLE={enabled} (0: NVLink SHARP off)");
    Ok(())
}

/// The value of `NCCL_NVLS_ENABLE` as found, or an error naming it.
fn nvls_choice(found: Option<sys::env::Found>) -> Result<u8, sys::env::EnvError> {
    let Some(found) = found else {
        return Err(sys::env::EnvError {
            var: NVLS_ENABLE.name,
            value: String::new(),
            reason: "it is not set. NCCL reads it from the environment, which a running \
                     program cannot change soundly, so set it before the program starts: \
                     NCCL_NVLS_ENABLE=0 keeps NVLink SHARP (multicast) off, as hosts whose \
                     GPUs others share need; 1 or 2 lets NCCL use it"
                .to_string(),
        });
    };
    found.parse_int::<u8>(0..=2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(value: Option<&str>) -> Result<u8, sys::env::EnvError> {
        nvls_choice(
            NVLS_ENABLE
                .lookup(|var| {
                    value
                        .filter(|_| var == "NCCL_NVLS_ENABLE")
                        .map(String::from)
                })
                .unwrap(),
        )
    }

    #[test]
    fn nvls_must_be_chosen_before_the_program_starts() {
        let unset = choice(None).unwrap_err().to_string();
        assert!(unset.contains("NCCL_NVLS_ENABLE"), "{unset}");
        assert!(unset.contains("before the program starts"), "{unset}");
        assert_eq!(choice(Some("0")).unwrap(), 0);
        assert_eq!(choice(Some("2")).unwrap(), 2);
        let bad = choice(Some("off")).unwrap_err().to_string();
        assert!(bad.contains("NCCL_NVLS_ENABLE=\"off\""), "{bad}");
        assert!(choice(Some("3")).is_err());
    }
}
