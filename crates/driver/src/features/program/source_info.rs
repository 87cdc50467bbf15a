//! What a module compiled from source knows of its source: the kernels'
//! parameter lists (parsed), the names NVRTC lowered, and the declarations
//! made on the program. Modules keep it to check declared kernels against;
//! it needs nothing of the module or the compiler.

use super::parse;
use crate::features::kernel_decl::KernelDecl;
use crate::ground::error::{Error, Result};

/// What a module compiled from source knows of it: its kernels' parameter
/// lists, for declarations to be checked against, and the lowered names.
#[derive(Clone, Debug)]
pub(crate) struct SourceInfo {
    pub(crate) program: String,
    pub(crate) kernels: Vec<parse::SourceKernel>,
    pub(crate) name_expressions: Vec<String>,
    pub(crate) lowered: Vec<(String, String)>,
    /// The declarations made with `Program::declare`, the only ones
    /// `Module::kernel` gives.
    pub(crate) declared: Vec<KernelDecl>,
}

impl SourceInfo {
    pub(crate) fn mismatch(&self, kernel: &'static str, reason: String) -> Error {
        Error::DeclarationMismatch {
            kernel,
            program: self.program.clone(),
            reason,
        }
    }

    /// Whether `decl` was declared on the program (its name and parameters:
    /// what the promise of `Program::declare` is about).
    pub(crate) fn is_declared(&self, decl: &KernelDecl) -> bool {
        self.declared
            .iter()
            // A claim of grid dependency synchronisation is part of what
            // the `unsafe` declare promised: a declaration that makes the
            // claim is not covered by one that did not.
            .any(|d| {
                d.name == decl.name
                    && d.params == decl.params
                    && (d.grid_dependency_sync || !decl.grid_dependency_sync)
            })
    }

    /// Check a declaration against the source; `Ok` gives the symbol to
    /// look up (the `extern "C"` name, or the name expression's lowered
    /// name; on the software driver the declared name itself).
    pub(crate) fn check(
        &self,
        name: &'static str,
        params: &[sys::signature::Param],
    ) -> Result<String> {
        let mismatch = |reason: String| self.mismatch(name, reason);
        parse::check(name, params, &self.kernels).map_err(mismatch)?;
        let (base, _) = parse::split_name_expression(name);
        let extern_c = self
            .kernels
            .iter()
            .any(|k| k.name == base && k.extern_c && k.template_params.is_empty());
        if extern_c && base == name {
            return Ok(name.to_string());
        }
        if !self.name_expressions.iter().any(|e| e == name) {
            return Err(mismatch(format!(
                "`{base}` is not an extern \"C\" kernel, so its symbol is mangled: give \
                 `{name}` to Program::name_expression before compiling, or declare the \
                 kernel extern \"C\""
            )));
        }
        Ok(self
            .lowered
            .iter()
            .find(|(e, _)| e == name)
            .map_or_else(|| name.to_string(), |(_, l)| l.clone()))
    }
}
