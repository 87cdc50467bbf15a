//! The compiler's check of a kernel's declaration: C++ appended to the
//! program's source that asserts each declared kernel's exact function type,
//! so that NVRTC compares the declaration with the `__global__` function as
//! it is after preprocessing (macros, typedefs, templates, included types),
//! which no reading of the source text can do.
//!
//! The appended text protects itself from the source it follows:
//! - it starts on a fresh line, past any `//` comment or `#define` continued
//!   by a trailing backslash;
//! - it `#undef`s every word it uses (keywords included: `#define float
//!   double` is the case it exists for) and the identifiers of each
//!   declared name, so the types it spells are the real ones. NVRTC reads
//!   name expressions after the whole source, so a name expression sees the
//!   same (undefined) words as the assertion does;
//! - it names itself with `#line`, so its errors are found by line whatever
//!   `#line` the source used;
//! - it ends with a kernel that the compiler is asked to lower by a name
//!   expression: had the text been swallowed (an unclosed comment), the
//!   compilation fails instead of passing unchecked.
//!
//! `unsigned long` and `long` (what `size_t` and `int64_t` are on Linux) are
//! taken as `unsigned long long` and `long long` where they are 8 bytes, and
//! a pointee's `volatile` is ignored; nothing else is.

use crate::features::kernel_decl::KernelDecl;
use sys::signature::{Access, Param, Scalar};

/// The file name the appended text reports its errors under.
pub(crate) const FILE: &str = "cuda-streams-declarations";

/// The kernel the appended text ends with; its name expression proves that
/// the text was compiled.
pub(crate) const SENTINEL: &str = "__cuda_streams_declarations_checked";

/// The words the fixed part uses, all `#undef`ed first.
const WORDS: &[&str] = &[
    "template",
    "class",
    "struct",
    "static",
    "const",
    "volatile",
    "bool",
    "false",
    "true",
    "typedef",
    "typename",
    "sizeof",
    "void",
    "unsigned",
    "long",
    "int",
    "char",
    "float",
    "double",
    "decltype",
    "static_assert",
    "extern",
    "value",
    "type",
    "__cuda_streams_same",
    "__cuda_streams_if",
    "__cuda_streams_canon",
    "__cuda_streams_fn",
    "__cuda_streams_check",
    "__cuda_streams_A",
    "__cuda_streams_B",
    "__cuda_streams_C",
    "__cuda_streams_T",
    "__cuda_streams_P",
    "__cuda_streams_F",
    "__cuda_streams_K",
    "__cuda_streams_D",
    "__cuda_streams_S",
    SENTINEL,
];

/// The templates the assertions use (after `#line 1`).
const TEMPLATES: &str = "\
template <class __cuda_streams_A, class __cuda_streams_B> struct __cuda_streams_same { static const bool value = false; };
template <class __cuda_streams_A> struct __cuda_streams_same<__cuda_streams_A, __cuda_streams_A> { static const bool value = true; };
template <bool __cuda_streams_C, class __cuda_streams_A, class __cuda_streams_B> struct __cuda_streams_if { typedef __cuda_streams_A type; };
template <class __cuda_streams_A, class __cuda_streams_B> struct __cuda_streams_if<false, __cuda_streams_A, __cuda_streams_B> { typedef __cuda_streams_B type; };
template <class __cuda_streams_T> struct __cuda_streams_canon { typedef __cuda_streams_T type; };
template <class __cuda_streams_T> struct __cuda_streams_canon<__cuda_streams_T*> { typedef typename __cuda_streams_canon<__cuda_streams_T>::type* type; };
template <class __cuda_streams_T> struct __cuda_streams_canon<const __cuda_streams_T> { typedef const typename __cuda_streams_canon<__cuda_streams_T>::type type; };
template <class __cuda_streams_T> struct __cuda_streams_canon<volatile __cuda_streams_T> { typedef typename __cuda_streams_canon<__cuda_streams_T>::type type; };
template <class __cuda_streams_T> struct __cuda_streams_canon<const volatile __cuda_streams_T> { typedef const typename __cuda_streams_canon<__cuda_streams_T>::type type; };
template <> struct __cuda_streams_canon<unsigned long> { typedef __cuda_streams_if<sizeof(unsigned long) == 8, unsigned long long, unsigned long>::type type; };
template <> struct __cuda_streams_canon<long> { typedef __cuda_streams_if<sizeof(long) == 8, long long, long>::type type; };
template <class __cuda_streams_F> struct __cuda_streams_fn;
template <class... __cuda_streams_P> struct __cuda_streams_fn<void (*)(__cuda_streams_P...)> { typedef void (*type)(typename __cuda_streams_canon<__cuda_streams_P>::type...); };
template <class __cuda_streams_K, class __cuda_streams_D, class __cuda_streams_S> struct __cuda_streams_check {
  static_assert(__cuda_streams_same<__cuda_streams_D, __cuda_streams_S>::value, \"cuda-streams: a kernel's declaration (D, from Rust) differs from its __global__ function (S) after preprocessing\");
  static const bool value = true;
};
";

/// A scalar's C++ type.
pub(crate) fn scalar(scalar: Scalar) -> &'static str {
    match scalar {
        Scalar::U8 => "unsigned char",
        Scalar::U32 => "unsigned int",
        Scalar::I32 => "int",
        Scalar::U64 => "unsigned long long",
        Scalar::I64 => "long long",
        Scalar::F32 => "float",
        Scalar::F64 => "double",
    }
}

/// The function-pointer type a declaration says its kernel has:
/// `void (*)(unsigned long long, const float*, float*)`.
pub(crate) fn function_type(params: &[Param]) -> String {
    let params: Vec<String> = params
        .iter()
        .map(|param| match *param {
            Param::Scalar(s) => scalar(s).to_string(),
            // `cudaGraphConditionalHandle` is a typedef of this.
            Param::Condition => "unsigned long long".to_string(),
            Param::Pointer {
                elem,
                access: Access::Read,
                ..
            } => format!("const {}*", scalar(elem)),
            Param::Pointer { elem, .. } => format!("{}*", scalar(elem)),
        })
        .collect();
    format!("void (*)({})", params.join(", "))
}

/// Whether `name` can stand in the assertion as the kernel's name: a C++
/// name or name expression (`scale<float, 4>`, `ns::k`), with nothing that
/// could close the `decltype(&…)` around it, start a comment or a string,
/// or end the line.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.trim().is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_:<>, *&".contains(c))
}

fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

/// The tag type that names a kernel in the compiler's messages.
fn tag(name: &str) -> String {
    let word: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("__cuda_streams_kernel_{word}")
}

/// The text appended to a source, and the line (under [`FILE`]) of each
/// declaration's assertion, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Appended {
    pub(crate) text: String,
    pub(crate) lines: Vec<u32>,
}

/// The assertions of `decls`, to append to their source. Every name must
/// pass [`valid_name`].
pub(crate) fn append(decls: &[KernelDecl]) -> Appended {
    let mut undef: Vec<&str> = WORDS.to_vec();
    for decl in decls {
        for word in identifiers(decl.name) {
            if !undef.contains(&word) {
                undef.push(word);
            }
        }
    }
    let mut text = String::from(
        "\n\n// cuda-streams: each declared kernel's type, checked by the compiler after \
         preprocessing.\n",
    );
    for word in undef {
        text.push_str("#undef ");
        text.push_str(word);
        text.push('\n');
    }
    text.push_str(&format!("#line 1 \"{FILE}\"\n"));
    text.push_str(TEMPLATES);
    let mut line = 1 + TEMPLATES.lines().count() as u32;
    let mut lines = Vec::new();
    for decl in decls {
        let tag = tag(decl.name);
        text.push_str(&format!("struct {tag};\n"));
        line += 1;
        text.push_str(&assertion(&tag, decl));
        lines.push(line);
        line += 1;
    }
    text.push_str(&format!("extern \"C\" __global__ void {SENTINEL}() {{}}\n"));
    Appended { text, lines }
}

/// One declaration's assertion, a line of its own.
fn assertion(tag: &str, decl: &KernelDecl) -> String {
    format!(
        "static_assert(__cuda_streams_check<{tag}, {}, __cuda_streams_fn<decltype(&{})>::type>::value, \
         \"cuda-streams: the declaration of kernel {} differs from its __global__ function\");\n",
        function_type(decl.params),
        decl.name.trim(),
        decl.name.trim(),
    )
}

/// What NVRTC's log says of the assertion at `line`: the source's type of
/// the kernel, when the log gives it, and the log's lines about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) source_type: Option<String>,
    pub(crate) lines: Vec<String>,
}

/// Whether the compiler refused the assertion at `line`; `None` when the log
/// says nothing of it.
pub(crate) fn failure(log: &str, line: u32) -> Option<Failure> {
    let at = format!("{FILE}({line})");
    let during = format!("at line {line}");
    let about = |text: &str| {
        text.contains(&at)
            || text
                .match_indices(&during)
                .any(|(i, m)| !text[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
    };
    let lines: Vec<String> = log
        .lines()
        .filter(|l| about(l))
        .map(|l| l.trim().to_string())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let source_type = lines.iter().find_map(|l| {
        let start = l.find("__cuda_streams_S=")? + "__cuda_streams_S=".len();
        let end = l[start..].find(']')? + start;
        Some(l[start..end].to_string())
    });
    Some(Failure { source_type, lines })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::signature::Extent;

    fn read(elem: Scalar) -> Param {
        Param::Pointer {
            elem,
            access: Access::Read,
            extent: Extent::Arg(0),
        }
    }
    fn write(elem: Scalar) -> Param {
        Param::Pointer {
            elem,
            access: Access::Write,
            extent: Extent::Arg(0),
        }
    }
    fn decl(name: &'static str, params: &'static [Param]) -> KernelDecl {
        KernelDecl {
            name,
            params,
            twin: None,
            grid_dependency_sync: false,
        }
    }

    #[test]
    fn each_rust_type_is_spelled_as_its_cpp_type() {
        assert_eq!(
            function_type(&[
                Param::Scalar(Scalar::U64),
                Param::Scalar(Scalar::F32),
                read(Scalar::F32),
                write(Scalar::F32),
            ]),
            "void (*)(unsigned long long, float, const float*, float*)"
        );
        assert_eq!(
            function_type(&[
                Param::Scalar(Scalar::U8),
                Param::Scalar(Scalar::U32),
                Param::Scalar(Scalar::I32),
                Param::Scalar(Scalar::I64),
                Param::Scalar(Scalar::F64),
                write(Scalar::I32),
                read(Scalar::U64),
            ]),
            "void (*)(unsigned char, unsigned int, int, long long, double, int*, const unsigned long long*)"
        );
        assert_eq!(function_type(&[]), "void (*)()");
    }

    #[test]
    fn each_declaration_is_one_assertion_of_its_exact_type() {
        static FILL: [Param; 2] = [
            Param::Scalar(Scalar::U64),
            Param::Pointer {
                elem: Scalar::F32,
                access: Access::Write,
                extent: Extent::Arg(0),
            },
        ];
        static SCALE: [Param; 3] = [
            Param::Scalar(Scalar::U64),
            Param::Scalar(Scalar::F64),
            Param::Pointer {
                elem: Scalar::F64,
                access: Access::Read,
                extent: Extent::Arg(0),
            },
        ];
        let appended = append(&[decl("fill", &FILL), decl("scale<double>", &SCALE)]);
        let text = &appended.text;
        assert!(text.starts_with("\n\n"), "{text}");
        assert!(
            text.contains(
                "static_assert(__cuda_streams_check<__cuda_streams_kernel_fill, \
                 void (*)(unsigned long long, float*), \
                 __cuda_streams_fn<decltype(&fill)>::type>::value, \
                 \"cuda-streams: the declaration of kernel fill differs from its __global__ function\");\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "static_assert(__cuda_streams_check<__cuda_streams_kernel_scale_double_, \
                 void (*)(unsigned long long, double, const double*), \
                 __cuda_streams_fn<decltype(&scale<double>)>::type>::value, "
            ),
            "{text}"
        );
        // Every word it spells, and the declared names' identifiers, are
        // undefined before use, so a source's `#define float double` cannot
        // reach them.
        for word in [
            "float", "double", "unsigned", "long", "const", "fill", "scale",
        ] {
            assert!(
                text.contains(&format!("\n#undef {word}\n")),
                "{word}: {text}"
            );
        }
        assert!(text.ends_with(&format!("extern \"C\" __global__ void {SENTINEL}() {{}}\n")));
        // The lines given are those of the assertions, under `#line 1`.
        let after_line: Vec<&str> = text
            .split_once(&format!("#line 1 \"{FILE}\"\n"))
            .unwrap()
            .1
            .lines()
            .collect();
        for (line, name) in appended.lines.iter().zip(["fill", "scale<double>"]) {
            let text = after_line[*line as usize - 1];
            assert!(
                text.starts_with("static_assert(") && text.contains(&format!("decltype(&{name})")),
                "line {line}: {text}"
            );
        }
    }

    #[test]
    fn a_name_that_could_escape_the_assertion_is_not_valid() {
        for good in [
            "fill",
            "scale<float>",
            "ns::k",
            "f<float, 4>",
            "g<const float*>",
        ] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "f)", "f\"", "f//", "f;", "f\n", "f#", "f/*"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    /// NVRTC 13.0's log (seen on an H200) for `#define float double` and
    /// `fill` declared with `f32`, the assertion on line 17 (the message
    /// lines shortened).
    const LOG: &str = "cuda-streams-declarations(15): error: static assertion failed with \"cuda-streams: a kernel's declaration (D, from Rust) differs from its __global__ function (S) after preprocessing\"
    static_assert(__cuda_streams_same<__cuda_streams_D, __cuda_streams_S>::value, \"...\");
    ^
          detected during instantiation of class \"__cuda_streams_check<__cuda_streams_K, __cuda_streams_D, __cuda_streams_S> [with __cuda_streams_K=__cuda_streams_kernel_fill, __cuda_streams_D=void (*)(unsigned long long, float *), __cuda_streams_S=void (*)(unsigned long long, double *)]\" at line 17

1 error detected in the compilation of \"fill.cu\".
";

    #[test]
    fn the_compilers_refusal_is_found_by_line_with_the_sources_type() {
        let found = failure(LOG, 17).unwrap();
        assert_eq!(
            found.source_type.as_deref(),
            Some("void (*)(unsigned long long, double *)")
        );
        assert_eq!(found.lines.len(), 1);
        assert_eq!(failure(LOG, 1), None);
        assert_eq!(failure(LOG, 171), None);
        let undefined = "cuda-streams-declarations(19): error: identifier \"nope\" is undefined";
        let found = failure(undefined, 19).unwrap();
        assert_eq!(found.source_type, None);
        assert_eq!(found.lines, [undefined]);
    }
}
