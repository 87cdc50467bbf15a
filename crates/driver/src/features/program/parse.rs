//! The parameter lists of a CUDA source's `__global__` functions, read well
//! enough to check a kernel's declaration against them: each parameter's
//! scalar type, or pointer element type and `const`-ness.
//!
//! This is no C++ parser. It finds `__global__` functions at any depth,
//! notes whether they are `extern "C"` (a prefix or an `extern "C" { … }`
//! block) and their `template <typename …>` parameters, and maps the usual
//! spellings of the seven scalar types (`float`, `unsigned int`, `uint64_t`,
//! `size_t`, …). A type it cannot map is reported as such, and a declaration
//! cannot be checked against it, so it is refused rather than trusted.

use sys::signature::{Access, Param, Scalar};

/// A parameter's type as the source spells it, after template substitution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SourceType {
    Scalar(Scalar),
    Pointer {
        elem: Scalar,
        is_const: bool,
    },
    /// Something else (a struct, a pointer to pointer, an unknown typedef).
    Other(String),
}

/// One `__global__` function.
#[derive(Clone, Debug)]
pub(crate) struct SourceKernel {
    pub(crate) name: String,
    pub(crate) extern_c: bool,
    pub(crate) template_params: Vec<String>,
    /// Each parameter's name (if it has one) and type tokens.
    pub(crate) params: Vec<(Option<String>, Vec<String>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
    Other,
}

fn tokenize(source: &str) -> Vec<Token> {
    tokenize_at(source)
        .into_iter()
        .map(|(token, _)| token)
        .collect()
}

/// The punctuation of `source` outside comments, strings and preprocessor
/// lines, each with the line it is on (from 1): what a syntax check of
/// brackets needs.
pub(crate) fn punctuation_lines(source: &str) -> Vec<(char, usize)> {
    let chars: Vec<char> = source.chars().collect();
    let mut line = 1;
    let mut seen = 0;
    tokenize_at(source)
        .into_iter()
        .filter_map(|(token, at)| {
            line += chars[seen..at].iter().filter(|&&c| c == '\n').count();
            seen = at;
            match token {
                Token::Punct(c) => Some((c, line)),
                _ => None,
            }
        })
        .collect()
}

/// Each token with the index of the character it starts at.
fn tokenize_at(source: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let mut push = |token| tokens.push((token, start));
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if c == '#' {
            // Preprocessor lines (with continuations) declare no kernels.
            while i < chars.len() && chars[i] != '\n' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
        } else if c == '"' || c == '\'' {
            let mut text = String::new();
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = chars.get(i) {
                    text.push(ch);
                }
                i += 1;
            }
            i += 1;
            push(if c == '"' {
                Token::Str(text)
            } else {
                Token::Other
            });
        } else if c.is_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            push(Token::Other);
        } else {
            push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

fn is_ident(token: Option<&Token>, word: &str) -> bool {
    matches!(token, Some(Token::Ident(w)) if w == word)
}

/// The index of the token closing the group opened at `open`.
fn matching(tokens: &[Token], open: usize, (o, c): (char, char)) -> Option<usize> {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token {
            Token::Punct(p) if *p == o => depth += 1,
            Token::Punct(p) if *p == c => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every `__global__` function of `source`, in order (a prototype and its
/// definition count once).
pub(crate) fn kernels(source: &str) -> Vec<SourceKernel> {
    let tokens = tokenize(source);
    let mut found: Vec<SourceKernel> = Vec::new();
    // Whether each open brace is an `extern "C" {` block.
    let mut braces: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('{') => {
                let extern_block = i >= 2
                    && is_ident(tokens.get(i - 2), "extern")
                    && tokens.get(i - 1) == Some(&Token::Str("C".into()));
                braces.push(extern_block);
            }
            Token::Punct('}') => {
                braces.pop();
            }
            Token::Ident(word) if word == "__global__" => {
                if let Some((kernel, end)) = kernel_at(&tokens, i, braces.contains(&true)) {
                    if !found.iter().any(|k| k.name == kernel.name) {
                        found.push(kernel);
                    }
                    i = end;
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

fn kernel_at(tokens: &[Token], at: usize, in_extern_block: bool) -> Option<(SourceKernel, usize)> {
    // Back to the start of the declaration: its `extern "C"` and `template <…>`.
    let mut start = at;
    while start > 0 && !matches!(tokens[start - 1], Token::Punct(';' | '{' | '}')) {
        start -= 1;
    }
    let head = &tokens[start..at];
    let extern_c = in_extern_block
        || head
            .windows(2)
            .any(|w| is_ident(Some(&w[0]), "extern") && w[1] == Token::Str("C".into()));
    let mut template_params = Vec::new();
    if let Some(t) = head.iter().position(|t| is_ident(Some(t), "template")) {
        let open = start + t + 1;
        if let Some(close) = matching(tokens, open, ('<', '>')) {
            for group in tokens[open + 1..close].split(|t| *t == Token::Punct(',')) {
                if let Some(Token::Ident(name)) = group.last() {
                    template_params.push(name.clone());
                }
            }
        }
    }
    // Forward to the parameter list; the name is the identifier before it.
    let mut i = at + 1;
    let mut name = None;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(w) if w == "__launch_bounds__" => {
                i = matching(tokens, i + 1, ('(', ')'))?;
            }
            Token::Ident(w) => name = Some(w.clone()),
            Token::Punct('(') => break,
            Token::Punct(';' | '{') => return None,
            _ => {}
        }
        i += 1;
    }
    let close = matching(tokens, i, ('(', ')'))?;
    let inner = &tokens[i + 1..close];
    let mut params = Vec::new();
    let void_only = inner.len() == 1 && is_ident(inner.first(), "void");
    if !inner.is_empty() && !void_only {
        let mut depth = 0i32;
        let mut current: Vec<&Token> = Vec::new();
        for token in inner.iter().chain(std::iter::once(&Token::Punct(','))) {
            match token {
                Token::Punct('<' | '(' | '[') => depth += 1,
                Token::Punct('>' | ')' | ']') => depth -= 1,
                Token::Punct(',') if depth == 0 => {
                    params.push(param_of(&current));
                    current.clear();
                    continue;
                }
                _ => {}
            }
            current.push(token);
        }
    }
    Some((
        SourceKernel {
            name: name?,
            extern_c,
            template_params,
            params,
        },
        close,
    ))
}

/// A parameter's name (the last identifier, when it follows a type) and its
/// type as words and `*`s.
fn param_of(tokens: &[&Token]) -> (Option<String>, Vec<String>) {
    let words: Vec<String> = tokens
        .iter()
        .map(|t| match t {
            Token::Ident(w) => w.clone(),
            Token::Punct(p) => p.to_string(),
            Token::Str(s) => format!("{s:?}"),
            Token::Other => "?".into(),
        })
        .collect();
    let type_words = words
        .iter()
        .filter(|w| !QUALIFIERS.contains(&w.as_str()) && *w != "*")
        .count();
    match tokens.last() {
        Some(Token::Ident(name)) if type_words > 1 && !TYPE_WORDS.contains(&name.as_str()) => {
            (Some(name.clone()), words[..words.len() - 1].to_vec())
        }
        _ => (None, words),
    }
}

const QUALIFIERS: &[&str] = &[
    "const",
    "volatile",
    "__restrict__",
    "__restrict",
    "restrict",
];
const TYPE_WORDS: &[&str] = &[
    "unsigned", "signed", "int", "long", "short", "char", "float", "double",
];

/// The scalar a list of type words names.
fn scalar_of(words: &[&str]) -> Option<Scalar> {
    let mut words: Vec<&str> = words.to_vec();
    words.sort_unstable();
    Some(match words.join(" ").as_str() {
        "char unsigned" | "uint8_t" => Scalar::U8,
        "unsigned" | "int unsigned" | "uint32_t" | "uint" => Scalar::U32,
        "int" | "int signed" | "signed" | "int32_t" => Scalar::I32,
        "long long unsigned"
        | "int long long unsigned"
        | "uint64_t"
        | "size_t"
        | "long unsigned"
        | "int long unsigned" => Scalar::U64,
        "long long"
        | "int long long"
        | "int64_t"
        | "long"
        | "int long"
        | "ptrdiff_t"
        | "long long signed"
        | "int long long signed" => Scalar::I64,
        "float" => Scalar::F32,
        "double" => Scalar::F64,
        _ => return None,
    })
}

/// The type of a parameter, with `substitute` applied to template names.
pub(crate) fn type_of(words: &[String], substitute: &[(String, String)]) -> SourceType {
    let mut expanded: Vec<String> = Vec::new();
    for word in words {
        match substitute.iter().find(|(name, _)| name == word) {
            Some((_, arg)) => expanded.extend(arg.split_whitespace().map(str::to_string)),
            None => expanded.push(word.clone()),
        }
    }
    let text = expanded.join(" ");
    let stars = expanded.iter().filter(|w| *w == "*").count();
    let first_star = expanded.iter().position(|w| w == "*");
    let base_part = &expanded[..first_star.unwrap_or(expanded.len())];
    let base: Vec<&str> = base_part
        .iter()
        .map(String::as_str)
        .filter(|w| !QUALIFIERS.contains(w))
        .collect();
    match (stars, scalar_of(&base)) {
        (0, Some(scalar)) => SourceType::Scalar(scalar),
        (1, Some(elem)) => SourceType::Pointer {
            elem,
            is_const: base_part.iter().any(|w| w == "const"),
        },
        _ => SourceType::Other(text),
    }
}

/// Split `scale<float, int>` into `scale` and `["float", "int"]`.
pub(crate) fn split_name_expression(expression: &str) -> (&str, Vec<String>) {
    let Some(open) = expression.find('<') else {
        return (expression.trim(), Vec::new());
    };
    let base = expression[..open].trim();
    let inner = expression[open + 1..].trim_end();
    let inner = inner.strip_suffix('>').unwrap_or(inner);
    let mut args = Vec::new();
    let (mut depth, mut current) = (0i32, String::new());
    for c in inner.chars() {
        match c {
            '<' | '(' => depth += 1,
            '>' | ')' => depth -= 1,
            ',' if depth == 0 => {
                args.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_string());
    }
    (base, args)
}

/// The macros `source` defines (`#define NAME …`, continued lines joined),
/// and those an NVRTC option defines (`-DNAME=…`, `--define-macro=NAME`).
/// Read line by line, so a `#define` inside a comment counts too: the
/// answer is used to refuse, never to accept.
pub(crate) fn macros(source: &str, options: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    let logical = source.replace("\\\r\n", " ").replace("\\\n", " ");
    for line in logical.lines() {
        let Some(rest) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix("define") else {
            continue;
        };
        if rest.starts_with(|c: char| c.is_whitespace()) {
            names.push(leading_identifier(rest.trim_start()));
        }
    }
    let mut options = options.iter().map(String::as_str);
    while let Some(option) = options.next() {
        let definition = match option {
            "-D" | "--define-macro" => options.next().unwrap_or(""),
            _ => match option
                .strip_prefix("--define-macro=")
                .or_else(|| option.strip_prefix("-D"))
            {
                Some(definition) => definition,
                None => continue,
            },
        };
        names.push(leading_identifier(definition));
    }
    names.retain(|name| !name.is_empty());
    names
}

fn leading_identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A macro among `macros` that the declaration of `name` depends on: the
/// kernel's name, a template argument, or a word of its parameter list.
/// Only the compiler, after preprocessing, can check such a declaration.
pub(crate) fn macro_in_declaration(
    name: &str,
    kernels: &[SourceKernel],
    macros: &[String],
) -> Option<String> {
    let (base, args) = split_name_expression(name);
    let kernel = kernels.iter().find(|k| k.name == base);
    let params = kernel
        .into_iter()
        .flat_map(|k| k.params.iter().flat_map(|(_, words)| words.iter()));
    let words = std::iter::once(base.to_string())
        .chain(args.iter().flat_map(|a| {
            a.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map(str::to_string)
                .collect::<Vec<_>>()
        }))
        .chain(params.cloned());
    words
        .into_iter()
        .find(|word| macros.iter().any(|m| m == word))
}

/// Compare `params`, declared for kernel `name` (an `extern "C"` name or a
/// name expression), with the source's kernels; the error names the
/// parameter that differs.
pub(crate) fn check(name: &str, params: &[Param], kernels: &[SourceKernel]) -> Result<(), String> {
    let (base, args) = split_name_expression(name);
    let Some(kernel) = kernels.iter().find(|k| k.name == base) else {
        let known: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        return Err(format!(
            "the source has no __global__ function `{base}` (its kernels: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    if kernel.template_params.len() != args.len() {
        return Err(if args.is_empty() {
            format!(
                "`{base}` is a template of {} parameter(s); declare it by a name expression \
                 such as `{base}<float>` and give the same expression to \
                 Program::name_expression",
                kernel.template_params.len()
            )
        } else {
            format!(
                "`{base}` takes {} template argument(s), the declaration gives {}",
                kernel.template_params.len(),
                args.len()
            )
        });
    }
    let substitute: Vec<(String, String)> = kernel
        .template_params
        .iter()
        .cloned()
        .zip(args.iter().cloned())
        .collect();
    if kernel.params.len() != params.len() {
        return Err(format!(
            "the source's `{base}` takes {} parameter(s), the declaration {}",
            kernel.params.len(),
            params.len()
        ));
    }
    for (index, ((param_name, words), declared)) in kernel.params.iter().zip(params).enumerate() {
        let source = type_of(words, &substitute);
        let what = match param_name {
            Some(n) => format!("parameter {index} (`{n}`)"),
            None => format!("parameter {index}"),
        };
        let matches = match (*declared, &source) {
            (Param::Scalar(d), SourceType::Scalar(s)) => d == *s,
            // A handle is an `unsigned long long`, under its typedef or not.
            (Param::Condition, SourceType::Scalar(s)) => *s == sys::signature::Scalar::U64,
            (Param::Condition, SourceType::Other(name)) => name == "cudaGraphConditionalHandle",
            (Param::Pointer { elem, access, .. }, SourceType::Pointer { elem: s, is_const }) => {
                elem == *s && (access == Access::Read) == *is_const
            }
            _ => false,
        };
        if !matches {
            let source_text = words.join(" ");
            let hint = match (*declared, &source) {
                (
                    Param::Pointer {
                        access: Access::Read,
                        ..
                    },
                    SourceType::Pointer {
                        is_const: false, ..
                    },
                ) => {
                    ": a read-only slice (`&[T; n]`) needs a `const` pointer in the source; a \
                     pointer the kernel may write is declared `&mut [T; n]`"
                }
                (
                    Param::Pointer {
                        access: Access::Write,
                        ..
                    },
                    SourceType::Pointer { is_const: true, .. },
                ) => ": the source's pointer is `const`, so declare it read-only (`&[T; n]`)",
                (_, SourceType::Other(_)) => {
                    ": that type cannot be checked, so it cannot be declared safely"
                }
                _ => "",
            };
            return Err(format!(
                "{what} of `{base}` is `{source_text}` in the source but declared as {declared}{hint}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::signature::Extent;

    const SOURCE: &str = r#"
        #include <cstdint>
        // extern "C" __global__ void commented_out(int x);
        template <typename T>
        __global__ void scale(size_t n, T a, T* __restrict__ y) { }
        extern "C" __global__ void __launch_bounds__(256)
        relu_affine(unsigned long long n, float a, float b, const float* x, float* y) {
            y[0] = "a string with __global__ void fake(";
        }
        extern "C" {
        __global__ void hist(const float * __restrict__ data, uint32_t n, unsigned int* bins);
        __global__ void empty(void) {}
        }
        __global__ void mangled(int) {}
    "#;

    fn read(elem: Scalar) -> Param {
        Param::Pointer {
            elem,
            access: Access::Read,
            extent: Extent::Elements(1),
        }
    }
    fn write(elem: Scalar) -> Param {
        Param::Pointer {
            elem,
            access: Access::Write,
            extent: Extent::Elements(1),
        }
    }

    #[test]
    fn finds_kernels_their_linkage_and_parameters() {
        let found = kernels(SOURCE);
        let names: Vec<(&str, bool)> = found
            .iter()
            .map(|k| (k.name.as_str(), k.extern_c))
            .collect();
        assert_eq!(
            names,
            [
                ("scale", false),
                ("relu_affine", true),
                ("hist", true),
                ("empty", true),
                ("mangled", false)
            ]
        );
        let relu = &found[1];
        assert_eq!(relu.params.len(), 5);
        assert_eq!(relu.params[3].0.as_deref(), Some("x"));
        assert_eq!(
            type_of(&relu.params[0].1, &[]),
            SourceType::Scalar(Scalar::U64)
        );
        assert_eq!(
            type_of(&relu.params[3].1, &[]),
            SourceType::Pointer {
                elem: Scalar::F32,
                is_const: true
            }
        );
        assert_eq!(found[3].params.len(), 0);
        assert_eq!(found[4].params[0].0, None);
    }

    #[test]
    fn a_matching_declaration_passes_and_each_difference_is_named() {
        let found = kernels(SOURCE);
        let good = [
            Param::Scalar(Scalar::U64),
            Param::Scalar(Scalar::F32),
            Param::Scalar(Scalar::F32),
            read(Scalar::F32),
            write(Scalar::F32),
        ];
        check("relu_affine", &good, &found).unwrap();
        let mut wrong_scalar = good;
        wrong_scalar[1] = Param::Scalar(Scalar::F64);
        let err = check("relu_affine", &wrong_scalar, &found).unwrap_err();
        assert!(
            err.contains("parameter 1 (`a`)") && err.contains("`float`"),
            "{err}"
        );
        let mut not_const = good;
        not_const[4] = read(Scalar::F32);
        let err = check("relu_affine", &not_const, &found).unwrap_err();
        assert!(
            err.contains("parameter 4 (`y`)") && err.contains("const"),
            "{err}"
        );
        let mut wrong_elem = good;
        wrong_elem[3] = read(Scalar::F64);
        let err = check("relu_affine", &wrong_elem, &found).unwrap_err();
        assert!(err.contains("parameter 3"), "{err}");
        let err = check("relu_affine", &good[..4], &found).unwrap_err();
        assert!(
            err.contains("takes 5 parameter(s), the declaration 4"),
            "{err}"
        );
        let err = check("nope", &good, &found).unwrap_err();
        assert!(
            err.contains("no __global__ function `nope`") && err.contains("relu_affine"),
            "{err}"
        );
    }

    #[test]
    fn a_condition_parameter_is_a_conditional_handle_and_nothing_else() {
        let found = kernels(
            r#"extern "C" __global__ void step(cudaGraphConditionalHandle more, unsigned int n,
                                               unsigned long long raw) {}"#,
        );
        let condition = [
            Param::Condition,
            Param::Scalar(Scalar::U32),
            Param::Condition,
        ];
        check("step", &condition, &found).unwrap();
        // A u64 declared for the handle: the source says it is a handle.
        let mut as_u64 = condition;
        as_u64[0] = Param::Scalar(Scalar::U64);
        let err = check("step", &as_u64, &found).unwrap_err();
        assert!(err.contains("parameter 0 (`more`)"), "{err}");
        // A condition declared for the `unsigned int`.
        let mut for_u32 = condition;
        for_u32[1] = Param::Condition;
        let err = check("step", &for_u32, &found).unwrap_err();
        assert!(err.contains("parameter 1 (`n`)"), "{err}");
    }

    #[test]
    fn templates_are_checked_through_their_name_expression() {
        let found = kernels(SOURCE);
        let params = [
            Param::Scalar(Scalar::U64),
            Param::Scalar(Scalar::F64),
            write(Scalar::F64),
        ];
        check("scale<double>", &params, &found).unwrap();
        let err = check("scale<float>", &params, &found).unwrap_err();
        assert!(err.contains("parameter 1"), "{err}");
        let err = check("scale", &params, &found).unwrap_err();
        assert!(err.contains("name expression"), "{err}");
        let hist = [
            read(Scalar::F32),
            Param::Scalar(Scalar::U32),
            write(Scalar::U32),
        ];
        check("hist", &hist, &found).unwrap();
    }

    #[test]
    fn macros_the_source_or_the_options_define_are_found_in_a_declaration() {
        let source = "#include <x.h>\n  #  define float double\n#define LONG \\\n  1\n#undef X\n\
                      #define\tF(x) x\nextern \"C\" __global__ void fill(unsigned long long n, float* y) {}\n\
                      extern \"C\" __global__ void plain(int* y) {}\n";
        let options = [
            "-DREAL=double".to_string(),
            "-D".into(),
            "N".into(),
            "--define-macro=M".into(),
            "-O3".into(),
        ];
        let found = macros(source, &options);
        assert_eq!(found, ["float", "LONG", "F", "REAL", "N", "M"]);
        let kernels = kernels(source);
        assert_eq!(
            macro_in_declaration("fill", &kernels, &found).as_deref(),
            Some("float")
        );
        assert_eq!(macro_in_declaration("plain", &kernels, &found), None);
        assert_eq!(
            macro_in_declaration("plain", &kernels, &["plain".to_string()]).as_deref(),
            Some("plain")
        );
        assert_eq!(
            macro_in_declaration("scale<REAL>", &kernels, &found).as_deref(),
            Some("REAL")
        );
    }
}
