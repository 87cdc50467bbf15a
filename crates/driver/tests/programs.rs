//! Kernels of one's own: CUDA source compiled at run time (`Program`),
//! declared once (`kernel!`) and launched through the typed launcher, on
//! either driver; and every kind of bad input of issue 30 (a syntax error,
//! a declaration that differs from the source, an unknown kernel name, an
//! architecture NVRTC cannot target, a twin that panics, slices shorter than
//! the declared count), each a clear error that leaves the context usable.
//!
//! The compiler's side runs against a fake NVRTC table (`Compiler::from_table`)
//! that records every call, so it is exercised here without NVRTC, and the
//! cache can be shown to call no NVRTC entry point on a hit. Where NVRTC is
//! installed (`Compiler::global`), the syntax-error and architecture cases run
//! against it too; where it is not, the fallback error is checked instead.
//!
//! Declaring a kernel on a program is the one `unsafe` promise (what its
//! body touches); its signature is checked by the compiler: with NVRTC an
//! assertion of its exact type is compiled with the source, so a macro that
//! changes a parameter's type (`#define float double`) is refused before any
//! launch, on a GPU by NVRTC and on the software driver by refusing a
//! declaration that depends on a macro.
//!
//! A twin that panics fails its context as a kernel fault does on a GPU
//! (sticky): every test here takes `serial()`, and that one resets the
//! software driver's faults when it ends.

use cuda_streams_driver::sys::nvrtc::Nvrtc;
use cuda_streams_driver::{
    Arch, Compiler, Context, DeclaredKernel, DeviceBuffer, Error, LaunchConfig, Program, Stream,
    kernel,
};
use std::sync::Arc;
use test_support::{FaultReset, ctx, serial};

const SOURCE: &str = r#"
// y[i] = a * y[i]
extern "C" __global__ void scale(unsigned long long n, float a, float* y) {
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}

// y[i] = i, unless i is 3 (its twin panics there)
extern "C" __global__ void cursed(unsigned long long n, float* y) {
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (float)i;
}
"#;

kernel! {
    /// `scale(n, a, y)`: `y[i] *= a`.
    pub struct Scale: fn scale(n: u64, a: f32, y: &mut [f32; n]);
    twin = per_thread(|t, n, a, y| {
        let i = t.global_x();
        if (i as u64) < n {
            y[i] *= a;
        }
    });
}

kernel! {
    /// `scale` with `a` declared `f64`: the source says `float`.
    pub struct ScaleWithDouble: fn scale(n: u64, a: f64, y: &mut [f32; n]);
}

kernel! {
    /// `scale` with `y` declared read-only: the source writes it (`float*`).
    pub struct ScaleReadOnly: fn scale(n: u64, a: f32, y: &[f32; n]);
}

kernel! {
    /// A kernel the source does not have.
    pub struct Missing: fn missing(n: u64, y: &mut [f32; n]);
}

kernel! {
    /// `cursed(n, y)`, whose twin panics at element 3.
    pub struct Cursed: fn cursed(n: u64, y: &mut [f32; n]);
    twin = per_thread(|t, n, y| {
        let i = t.global_x();
        assert!(i != 3, "element 3 is cursed");
        if (i as u64) < n {
            y[i] = i as f32;
        }
    });
}

/// `SOURCE` as a program, `scale` and `cursed` declared.
fn program() -> Program {
    // SAFETY: scale and cursed touch y[i] for i < n only (SOURCE above).
    unsafe {
        Program::new(SOURCE)
            .name("programs.cu")
            .no_cache()
            .declare::<Scale>()
            .declare::<Cursed>()
    }
}

/// The result of compiling `program`, or `None` (said why) on a GPU
/// without NVRTC.
fn compiled(
    ctx: &Arc<Context>,
    program: &Program,
) -> Option<cuda_streams_driver::Result<Arc<cuda_streams_driver::Module>>> {
    match program.compile_for(ctx) {
        Err(Error::NvrtcUnavailable { reason }) if ctx.is_gpu() => {
            eprintln!("skipped: compiling on a GPU needs NVRTC: {reason}");
            None
        }
        result => Some(result),
    }
}

/// The module of `SOURCE` on the selected driver, or `None` (said why) on a
/// GPU without NVRTC.
fn module(ctx: &Arc<Context>) -> Option<Arc<cuda_streams_driver::Module>> {
    compiled(ctx, &program()).map(|module| module.expect("compiling the test source"))
}

/// The context still works: a declared launch runs and gives the right values.
fn still_usable(ctx: &Arc<Context>, module: &Arc<cuda_streams_driver::Module>) {
    let stream = Stream::new(ctx).unwrap();
    let scale: Scale = module.kernel().unwrap();
    let mut y = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    scale
        .launch(&stream, LaunchConfig::for_num_elems(4), 4, 0.5, &mut y)
        .unwrap();
    assert_eq!(y.to_vec(&stream).unwrap(), [0.5, 1.0, 1.5, 2.0]);
}

#[test]
fn a_kernel_compiled_from_source_and_declared_launches_typed() {
    let _serial = serial();
    let ctx = ctx();
    let Some(module) = module(&ctx) else { return };
    let stream = Stream::new(&ctx).unwrap();
    let scale: Scale = module.kernel().unwrap();
    assert_eq!(scale.kernel().signature(), Some(Scale::DECL.params));
    let host: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let mut y = DeviceBuffer::from_slice(&stream, &host).unwrap();
    scale
        .launch(
            &stream,
            LaunchConfig::for_num_elems(1000),
            1000,
            3.0,
            &mut y,
        )
        .unwrap();
    let expected: Vec<f32> = host.iter().map(|v| v * 3.0).collect();
    assert_eq!(y.to_vec(&stream).unwrap(), expected);
}

#[test]
fn a_declaration_that_differs_from_the_source_is_refused_naming_the_parameter() {
    let _serial = serial();
    let ctx = ctx();
    let Some(module) = module(&ctx) else { return };

    // SAFETY: as `program()`; the declaration is refused before any launch.
    let wrong = unsafe { program().declare::<ScaleWithDouble>() };
    let err = compiled(&ctx, &wrong).unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeclarationMismatch {
                kernel: "scale",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("parameter 1 (`a`)"), "{text}");
    assert!(text.contains("programs.cu"), "{text}");

    // SAFETY: as above.
    let read_only = unsafe { program().declare::<ScaleReadOnly>() };
    let err = compiled(&ctx, &read_only).unwrap().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("parameter 2 (`y`)"), "{text}");

    still_usable(&ctx, &module);
}

#[test]
fn an_unknown_kernel_name_is_refused_naming_it_and_the_kernels_there_are() {
    let _serial = serial();
    let ctx = ctx();
    let Some(module) = module(&ctx) else { return };

    // SAFETY: refused before any launch: the source has no `missing`.
    let missing = unsafe { program().declare::<Missing>() };
    let err = compiled(&ctx, &missing).unwrap().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("`missing`"), "{text}");
    assert!(text.contains("scale, cursed"), "{text}");

    // By name, without a declaration: the driver's lookup fails, naming it.
    let err = module.function("nowhere").unwrap_err();
    assert!(
        matches!(&err, Error::FunctionNotFound { name, .. } if name == "nowhere"),
        "{err:?}"
    );
    // A typo is answered with the names the module has and the closest,
    // not with an explanation of CPU twins.
    let text = module.function("scalee").unwrap_err().to_string();
    assert!(
        text.contains("no kernel named `scalee`")
            && text.contains("scale, cursed")
            && text.contains("did you mean `scale`?")
            && !text.contains("twin"),
        "{text}"
    );

    still_usable(&ctx, &module);
}

#[test]
fn slices_shorter_than_the_declared_count_are_refused_before_the_launch() {
    let _serial = serial();
    let ctx = ctx();
    let Some(module) = module(&ctx) else { return };
    let stream = Stream::new(&ctx).unwrap();
    let scale: Scale = module.kernel().unwrap();
    let mut y = DeviceBuffer::from_slice(&stream, &[1.0f32; 4]).unwrap();

    let err = scale
        .launch(&stream, LaunchConfig::for_num_elems(10), 10, 2.0, &mut y)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`scale` argument 2") && text.contains("10 element(s) of f32"),
        "{text}"
    );
    assert!(text.ends_with("holds 4 element(s) of f32"), "{text}");
    // Nothing ran: the buffer is as it was.
    assert_eq!(y.to_vec(&stream).unwrap(), [1.0; 4]);

    still_usable(&ctx, &module);
}

#[test]
fn a_twin_that_panics_is_caught_and_fails_its_launch() {
    let _serial = serial();
    let _reset = FaultReset;
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: twins run on the software driver only");
        return;
    }
    let Some(module) = module(&ctx) else { return };
    let stream = Stream::new(&ctx).unwrap();
    let cursed: Cursed = module.kernel().unwrap();
    let mut y = DeviceBuffer::from_slice(&stream, &[0.0f32; 8]).unwrap();

    // The launch is accepted; the twin's panic fails it on the stream.
    cursed
        .launch(&stream, LaunchConfig::for_num_elems(8), 8, &mut y)
        .unwrap();
    let err = stream.synchronize().unwrap_err();
    // The returned error names the twin and the panic's message.
    let message = err.to_string();
    assert!(
        message.contains("CUDA_ERROR_LAUNCH_FAILED")
            && message.contains("twin `cursed` panicked")
            && message.contains("element 3 is cursed"),
        "{message}"
    );
    assert!(matches!(err, Error::WorkFailed { .. }), "{err:?}");
    assert_eq!(
        err.driver_error().map(|e| e.code()),
        Some(cuda_streams_driver::sys::CUresult::CUDA_ERROR_LAUNCH_FAILED)
    );
    // The stream's fault says which twin panicked, and why.
    let (_, detail) = soft_driver::faults::stream_fault(stream.as_raw())
        .unwrap()
        .expect("the stream's fault");
    assert!(
        detail.contains("twin `cursed` panicked") && detail.contains("element 3 is cursed"),
        "{detail}"
    );

    // As after a kernel fault on a GPU the context's error is sticky; once
    // it is cleared (on a GPU: a new context), the same module works.
    drop(_reset);
    still_usable(&ctx, &module);
}

kernel! {
    /// `fill(n, y)`: `y[i] = 1` for `i < n`, declared with `f32`.
    pub struct Fill: fn fill(n: u64, y: &mut [f32; n]);
    twin = per_thread(|t, n, y| {
        if (t.global_x() as u64) < n {
            y[t.global_x()] = 1.0;
        }
    });
}

/// `fill` whose `float` a macro makes `double`: as declared (`f32`), the
/// kernel would write 8n bytes into a buffer of 4n.
const FLOAT_IS_DOUBLE: &str = r#"
#define float double
extern "C" __global__ void fill(unsigned long long n, float* y) {
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1;
}
"#;

/// The same kernel, written plainly.
const FILL: &str = r#"
extern "C" __global__ void fill(unsigned long long n, float* y) {
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1;
}
"#;

fn fill_program(source: &str) -> Program {
    // SAFETY: fill writes y[i] for i < n only.
    unsafe {
        Program::new(source)
            .name("fill.cu")
            .no_cache()
            .declare::<Fill>()
    }
}

/// Issue 41: the parameter list reads `float`, the compiler sees `double`.
/// Refused when the program is compiled, naming the kernel; on a GPU by
/// NVRTC's check of the declared type (both types named), on the software
/// driver because the declaration depends on a macro.
#[test]
fn a_macro_that_changes_a_declared_type_is_refused_before_any_launch() {
    let _serial = serial();
    let ctx = ctx();
    let Some(result) = compiled(&ctx, &fill_program(FLOAT_IS_DOUBLE)) else {
        return;
    };
    let err = result.unwrap_err();
    assert!(
        matches!(err, Error::DeclarationMismatch { kernel: "fill", .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("fill.cu"), "{text}");
    if ctx.is_gpu() {
        assert!(
            text.contains("void (*)(unsigned long long, double *)")
                && text.contains("void (*)(unsigned long long, float*)"),
            "{text}"
        );
    } else {
        assert!(text.contains("macro `float`"), "{text}");
    }
    // The same macro as an option.
    let option = fill_program(FILL).options(["-Dfloat=double"]);
    let Some(result) = compiled(&ctx, &option) else {
        return;
    };
    assert!(
        matches!(
            result.unwrap_err(),
            Error::DeclarationMismatch { kernel: "fill", .. } | Error::Compile { .. }
        ),
        "an option that redefines float is refused"
    );
    // Written plainly, the same declaration compiles and launches.
    let module = compiled(&ctx, &fill_program(FILL)).unwrap().unwrap();
    let fill: Fill = module.kernel().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut y = DeviceBuffer::from_slice(&stream, &[0.0f32; 5]).unwrap();
    fill.launch(&stream, LaunchConfig::for_num_elems(4), 4, &mut y)
        .unwrap();
    assert_eq!(y.to_vec(&stream).unwrap(), [1.0, 1.0, 1.0, 1.0, 0.0]);
}

/// Only a kernel declared on its program (the `unsafe` promise) comes out
/// of a module compiled from source.
#[test]
fn a_kernel_not_declared_on_its_program_is_refused() {
    let _serial = serial();
    let ctx = ctx();
    let undeclared = Program::new(FILL).name("fill.cu").no_cache();
    let Some(result) = compiled(&ctx, &undeclared) else {
        return;
    };
    let err = result.unwrap().kernel::<Fill>().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`fill`") && text.contains("declare::<Fill>()"),
        "{text}"
    );
}

/// Compile errors and the cache, against a fake NVRTC that records its calls.
#[path = "programs_support/fake_nvrtc.rs"]
mod fake;

/// A fresh cache directory of this test's own.
fn cache_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cuda-streams-programs-{test}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_cache_hit_calls_no_nvrtc_entry_point() {
    let compiler = fake::compiler();
    let dir = cache_dir("hit");
    let program = Program::new(SOURCE).name("programs.cu").cache_dir(&dir);
    let arch = Arch::new(9, 0);

    let cold = program.compile_with(&compiler, arch).unwrap();
    assert!(!cold.from_cache());
    let after_cold = fake::calls();
    assert!(
        after_cold.contains(&"nvrtcCompileProgram"),
        "{after_cold:?}"
    );

    let hit = program.compile_with(&compiler, arch).unwrap();
    assert!(hit.from_cache());
    assert_eq!(hit.image(), cold.image());
    assert_eq!(fake::calls(), after_cold, "a cache hit called NVRTC");

    // Anything in the key that differs compiles again.
    let other = program.clone().options(["-DOTHER"]);
    assert!(!other.compile_with(&compiler, arch).unwrap().from_cache());
    let other_arch = program.compile_with(&compiler, Arch::new(8, 0)).unwrap();
    assert!(!other_arch.from_cache());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The compiler is given the declarations' assertions and the name
/// expression that proves they were compiled; its refusal of one comes back
/// as that kernel's declaration error, with both types.
#[test]
fn the_compiler_is_given_each_declarations_type_and_its_refusal_names_the_kernel() {
    let compiler = fake::compiler();
    let compiled = fill_program(FILL)
        .compile_with(&compiler, Arch::new(9, 0))
        .unwrap();
    // The proof's name expression is not one of the program's.
    assert_eq!(
        compiled.lowered_name("__cuda_streams_declarations_checked"),
        None
    );
    assert!(fake::calls().contains(&"nvrtcAddNameExpression"));

    let err = fill_program(FLOAT_IS_DOUBLE)
        .compile_with(&compiler, Arch::new(9, 0))
        .unwrap_err();
    assert!(
        matches!(err, Error::DeclarationMismatch { kernel: "fill", .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("NVRTC, after preprocessing, gives `fill` the type void (*)(unsigned long long, double *), but the declaration says void (*)(unsigned long long, float*)"),
        "{text}"
    );
    // Without declarations nothing is appended, and nothing is refused.
    Program::new(FLOAT_IS_DOUBLE)
        .no_cache()
        .compile_with(&compiler, Arch::new(9, 0))
        .unwrap();
}

/// With the real NVRTC, where installed (no GPU needed): declarations that
/// match after preprocessing compile, in every spelling the check accepts
/// (`size_t`, `__restrict__`, top-level `const`, templates, mangled
/// names), and `#define float double` is refused naming both types.
#[test]
fn real_nvrtc_checks_each_declared_type_after_preprocessing() {
    let compiler = match Compiler::global() {
        Ok(compiler) => compiler,
        Err(err) => {
            eprintln!("skipped: NVRTC is not installed: {err}");
            return;
        }
    };
    kernel! {
        pub struct Spellings: fn spellings(n: u64, a: i64, x: &[f32; n], y: &mut [f32; n], c: &mut [u64; 1]);
    }
    kernel! {
        pub struct ScaleF64: fn "scale<double>"(n: u64, a: f64, y: &mut [f64; n]);
    }
    kernel! {
        pub struct Mangled: fn mangled(n: u32, y: &mut [i32; n]);
    }
    const SPELLINGS: &str = r#"
typedef float real;
extern "C" __global__ void spellings(size_t n, long a, const real* const __restrict__ x,
                                     float* __restrict__ y, unsigned long* c) {}
template <typename T> __global__ void scale(unsigned long long n, T a, T* y) {}
__global__ void mangled(unsigned int n, int* y) {}
"#;
    // SAFETY: the kernels' bodies are empty.
    let program = unsafe {
        Program::new(SPELLINGS)
            .name("spellings.cu")
            .no_cache()
            .name_expression("scale<double>")
            .name_expression("mangled")
            .declare::<Spellings>()
            .declare::<ScaleF64>()
            .declare::<Mangled>()
    };
    let compiled = program.compile_with(compiler, Arch::new(9, 0)).unwrap();
    assert!(compiled.lowered_name("scale<double>").is_some());

    let err = fill_program(FLOAT_IS_DOUBLE)
        .compile_with(compiler, Arch::new(9, 0))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::DeclarationMismatch { kernel: "fill", .. })
            && text.contains("double *")
            && text.contains("float*"),
        "{text}"
    );
    // `scale<float>` with `#define float double`: the name expression and
    // the assertion both read `float` as the source's macros leave it.
    kernel! {
        pub struct ScaleF32: fn "scale<float>"(n: u64, a: f32, y: &mut [f32; n]);
    }
    // SAFETY: the body is empty.
    let templated = unsafe {
        Program::new("#define float double\ntemplate <typename T> __global__ void scale(unsigned long long n, T a, T* y) {}\n")
            .no_cache()
            .name_expression("scale<float>")
            .declare::<ScaleF32>()
    };
    match templated.compile_with(compiler, Arch::new(9, 0)) {
        // Checked and lowered as the real `float`: consistent.
        Ok(compiled) => assert_eq!(
            compiled.lowered_name("scale<float>"),
            Some("_Z5scaleIfEvyT_PS0_")
        ),
        Err(err) => assert!(matches!(err, Error::DeclarationMismatch { .. }), "{err:?}"),
    }
}

/// A cached image that was damaged on disk is not loaded: NVRTC compiles
/// the program again, and the entry is rewritten.
#[test]
fn a_damaged_cache_entry_is_compiled_again() {
    let compiler = fake::compiler();
    let dir = cache_dir("damaged");
    let program = Program::new(SOURCE).name("programs.cu").cache_dir(&dir);
    let arch = Arch::new(9, 0);
    let cold = program.compile_with(&compiler, arch).unwrap();
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0x20; // a byte of the image
    std::fs::write(&entries[0], &bytes).unwrap();

    let again = program.compile_with(&compiler, arch).unwrap();
    assert!(!again.from_cache(), "a damaged entry was used");
    assert_eq!(again.image(), cold.image());
    assert!(program.compile_with(&compiler, arch).unwrap().from_cache());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_cache_every_compile_calls_nvrtc() {
    let compiler = fake::compiler();
    let program = Program::new(SOURCE).no_cache();
    for _ in 0..2 {
        let compiled = program.compile_with(&compiler, Arch::new(9, 0)).unwrap();
        assert!(!compiled.from_cache());
    }
    let compiles = fake::calls()
        .iter()
        .filter(|c| **c == "nvrtcCompileProgram")
        .count();
    assert_eq!(compiles, 2);
}

#[test]
fn a_syntax_error_returns_the_compilers_log() {
    let compiler = fake::compiler();
    let broken = Program::new("extern \"C\" __global__ void k(int* x) { syntax error }")
        .name("programs.cu")
        .no_cache();
    let err = broken.compile_with(&compiler, Arch::new(9, 0)).unwrap_err();
    match &err {
        Error::Compile { program, arch, log } => {
            assert_eq!(program, "programs.cu");
            assert_eq!(*arch, Arch::new(9, 0));
            assert_eq!(log, fake::SYNTAX_ERROR_LOG);
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("programs.cu") && text.contains("sm_90"),
        "{text}"
    );
    assert!(text.contains(fake::SYNTAX_ERROR_LOG), "{text}");
    // The program was destroyed on the error path too.
    assert!(fake::calls().contains(&"nvrtcDestroyProgram"));
    // And the compiler still works.
    let good = Program::new(SOURCE).no_cache();
    good.compile_with(&compiler, Arch::new(9, 0)).unwrap();
}

#[test]
fn without_a_gpu_compile_for_checks_the_source_and_says_when_it_did_not_compile_it() {
    let _serial = serial();
    let ctx = ctx();
    if ctx.is_gpu() {
        eprintln!("skipped on the GPU: NVRTC compiles every source there");
        return;
    }
    // SAFETY: refused before any launch.
    let unclosed = unsafe {
        Program::new(
            "extern \"C\" __global__ void scale(unsigned long long n, float a, float* y) {\n\
             \x20   if (n > 0) { y[0] *= a;\n\
             }\n",
        )
        .name("unclosed.cu")
        .no_cache()
        .declare::<Scale>()
    };
    let err = unclosed.compile_for(&ctx).unwrap_err();
    match cuda_streams_driver::Compiler::global() {
        // NVRTC installed (pip's wheel needs no GPU): it compiled the source.
        Ok(_) => assert!(matches!(err, Error::Compile { .. }), "{err}"),
        // No compiler at all: the brackets were checked, and the error says
        // the source was not compiled.
        Err(_) => {
            let text = err.to_string();
            assert!(
                matches!(&err, Error::SourceNotCompiled { program, .. } if program == "unclosed.cu"),
                "{err:?}"
            );
            assert!(
                text.contains("`{` opened on line 1 is never closed")
                    && text.contains("was not compiled")
                    && text.contains("pip install nvidia-cuda-nvrtc"),
                "{text}"
            );
        }
    }
    // Balanced source still makes a module of the twins.
    assert!(module(&ctx).is_some());
}

#[test]
fn an_architecture_nvrtc_cannot_target_is_refused_before_compiling() {
    let compiler = fake::compiler();
    let err = Program::new(SOURCE)
        .no_cache()
        .compile_with(&compiler, Arch::new(3, 0))
        .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedArch { arch, .. } if arch == Arch::new(3, 0)),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("sm_30"), "{text}");
    assert!(text.contains("sm_75, sm_80, sm_90"), "{text}");
    assert!(!fake::calls().contains(&"nvrtcCompileProgram"));
    Program::new(SOURCE)
        .no_cache()
        .compile_with(&compiler, Arch::new(8, 0))
        .unwrap();
}

/// The same two errors from the real NVRTC, where it is installed; where it
/// is not (CI), the error says what to install.
#[test]
fn real_nvrtc_returns_its_log_and_refuses_old_architectures_or_says_what_to_install() {
    let compiler = match Compiler::global() {
        Ok(compiler) => compiler,
        Err(err) => {
            assert!(matches!(err, Error::NvrtcUnavailable { .. }), "{err:?}");
            let text = err.to_string();
            assert!(text.contains("nvidia-cuda-nvrtc"), "{text}");
            assert!(text.contains("CUDA_STREAMS_NVRTC_LIBRARY"), "{text}");
            eprintln!("NVRTC is not installed: checked the fallback error only");
            return;
        }
    };
    let arch = Arch::new(9, 0);
    let broken = Program::new("extern \"C\" __global__ void k(int* x) { *x = ; }")
        .name("broken.cu")
        .no_cache();
    let err = broken.compile_with(compiler, arch).unwrap_err();
    let Error::Compile { log, .. } = &err else {
        panic!("expected a compile error, got {err:?}")
    };
    assert!(log.contains("broken.cu") && log.contains("error"), "{log}");

    let err = Program::new(SOURCE)
        .no_cache()
        .compile_with(compiler, Arch::new(3, 0))
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedArch { .. }), "{err:?}");

    let compiled = Program::new(SOURCE)
        .no_cache()
        .compile_with(compiler, arch)
        .unwrap();
    assert!(!compiled.image().is_empty());
}

/// On a GPU whose driver reports parameter sizes (`cuFuncGetParamInfo`), a
/// declaration taken on trust for a bare binary is still compared with it.
#[test]
fn a_bare_binarys_parameter_sizes_are_checked_where_the_driver_reports_them() {
    let _serial = serial();
    let ctx = ctx();
    if !ctx.is_gpu() {
        eprintln!("skipped: cuFuncGetParamInfo is a GPU driver's; the software driver runs twins");
        return;
    }
    if cuda_streams_driver::sys::optional::func_get_param_info().is_none() {
        eprintln!("skipped: this driver has no cuFuncGetParamInfo (CUDA 12.4 and later)");
        return;
    }
    let compiled = match Program::new(SOURCE).no_cache().compile(Arch::of(&ctx)) {
        Ok(compiled) => compiled,
        Err(err) => {
            eprintln!("skipped: compiling on a GPU needs NVRTC: {err}");
            return;
        }
    };
    let bytes: &'static [u8] = Box::leak(compiled.image().to_vec().into_boxed_slice());
    let module = cuda_streams_driver::Module::load(&ctx, bytes).unwrap();
    // SAFETY: nothing is launched with this declaration: the size check
    // refuses it (`a` is a 4-byte float in the binary, declared f64).
    let err = unsafe { module.kernel_unchecked::<ScaleWithDouble>() }.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("parameter 1 is 4 bytes in the binary, 8 as declared"),
        "{text}"
    );
    // SAFETY: Scale is scale's exact declaration (the source above).
    let scale = unsafe { module.kernel_unchecked::<Scale>() }.unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut y = DeviceBuffer::from_slice(&stream, &[1.0f32, 2.0]).unwrap();
    scale
        .launch(&stream, LaunchConfig::for_num_elems(2), 2, 4.0, &mut y)
        .unwrap();
    assert_eq!(y.to_vec(&stream).unwrap(), [4.0, 8.0]);
}
