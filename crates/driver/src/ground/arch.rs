//! A GPU architecture (a compute capability): a plain value that NVRTC
//! targets and that errors name, so it lives on the ground floor.
//! [`Arch::of`] (a context's device) is defined with the programs.

use std::fmt;

/// A GPU architecture: a compute capability.
///
/// ```
/// use cuda_streams_driver::Arch;
/// assert_eq!(Arch::new(9, 0).to_string(), "sm_90");
/// assert_eq!(Arch::new(12, 0).number(), 120);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl Arch {
    /// Compute capability `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// `major * 10 + minor`, as NVRTC lists architectures.
    pub const fn number(self) -> u32 {
        self.major * 10 + self.minor
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.number())
    }
}
