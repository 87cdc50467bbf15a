//! What the demo's parts share: its sizes, chosen by driver, and its result
//! type. Kept apart from `demo.rs`, which runs the parts (`dag.rs`,
//! `steps.rs`), so that they take these from below instead of from it.

use cuda_streams::prelude::*;
use std::error::Error;

pub(crate) type DemoResult<T> = Result<T, Box<dyn Error>>;

/// How big the demo is: small on the software driver (it must finish in a
/// few seconds on two cores), big enough on a GPU to show the overlap.
pub(crate) struct Sizes {
    pub(crate) elements: usize,
    pub(crate) steps: u64,
    /// The kernel's iteration count on the software driver; on a GPU it is
    /// chosen so the kernel takes about as long as a step's upload.
    pub(crate) iterations: u32,
    pub(crate) dag_elements: usize,
    pub(crate) dag_rounds: usize,
}

impl Sizes {
    pub(crate) fn for_context(ctx: &Context) -> Self {
        if ctx.is_gpu() {
            Sizes {
                elements: 1 << 22,
                steps: 64,
                iterations: 64,
                dag_elements: 1 << 20,
                dag_rounds: 64,
            }
        } else {
            Sizes {
                elements: 1 << 16,
                steps: 32,
                iterations: 16,
                dag_elements: 1 << 16,
                dag_rounds: 8,
            }
        }
    }
}
