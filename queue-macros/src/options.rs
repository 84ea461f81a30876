//! Parsing of the attribute's options: `#[job(queue = "emails", max_attempts = 5, ...)]`.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Lit, LitStr, Meta, Token, UnOp};

use crate::duration;
use crate::errors::Errors;

/// Every option `#[job]` accepts, in the order they are listed in messages.
const KNOWN: &[&str] = &[
    "queue",
    "max_attempts",
    "timeout",
    "name",
    "version",
    "cron",
    "rate_key",
    "deadline",
];

/// Validated options. `None` means "not given": the `Job` trait default applies
/// (the queue and name have defaults chosen by the code generator).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct JobOptions {
    /// `queue = "..."`.
    pub(crate) queue: Option<String>,
    /// `max_attempts = N`, N >= 1.
    pub(crate) max_attempts: Option<u32>,
    /// `timeout = "30s"`, in milliseconds, > 0.
    pub(crate) timeout_ms: Option<u64>,
    /// `name = "..."`.
    pub(crate) name: Option<String>,
    /// `version = N`, N >= 1.
    pub(crate) version: Option<u32>,
    /// `cron = "0 */5 * * * *"`: a periodic job, parsed here with the
    /// `cron` crate queue-core's scheduler uses; the span is the literal's.
    pub(crate) cron: Option<SpannedValue<String>>,
    /// `rate_key = tenant` (a field of the args, or a path `customer.id`):
    /// the tokens with their spans, read from the args at enqueue (docs/LIMITS.md).
    pub(crate) rate_key: Option<FieldPath>,
    /// `deadline = "5m"`: execution deadline across attempts since the first
    /// start (`Job::DEADLINE`), in milliseconds, > 0.
    pub(crate) deadline_ms: Option<u64>,
}

/// An option's value and the span of the token it came from, so code
/// generated for it reports errors there. Compared by value only.
#[derive(Debug, Clone)]
pub(crate) struct SpannedValue<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

impl<T: PartialEq> PartialEq for SpannedValue<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for SpannedValue<T> {}

/// `rate_key = customer.id`: the field path's tokens, each with the user's
/// span (an unknown field is reported at its name). Compared and printed as
/// text.
#[derive(Clone)]
pub(crate) struct FieldPath {
    pub(crate) tokens: TokenStream,
    /// The span of the path's first token.
    pub(crate) span: Span,
}

impl FieldPath {
    /// `"customer . id"`.
    pub(crate) fn text(&self) -> String {
        self.tokens.to_string()
    }
}

impl PartialEq for FieldPath {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl Eq for FieldPath {}

impl fmt::Debug for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FieldPath({})", self.text())
    }
}

/// Parses the attribute's tokens.
///
/// Problems are recorded in `errors`, each at the offending token; the
/// returned options hold every option that was valid, so the caller can still
/// generate code and the user sees only the real mistakes.
pub(crate) fn parse(attr: TokenStream, errors: &mut Errors) -> JobOptions {
    let mut options = JobOptions::default();
    let metas = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr) {
        Ok(metas) => metas,
        Err(e) => {
            errors.push(e);
            return options;
        }
    };

    let mut seen = HashSet::new();
    for meta in metas {
        let Some(ident) = meta.path().get_ident().cloned() else {
            errors.spanned(
                meta.path(),
                format!(
                    "expected a #[job] option name, one of: {}",
                    KNOWN.join(", ")
                ),
            );
            continue;
        };
        let key = ident.to_string();
        if !KNOWN.contains(&key.as_str()) {
            errors.at(ident.span(), unknown_option_message(&key));
            continue;
        }
        if !seen.insert(key.clone()) {
            errors.at(ident.span(), format!("duplicate #[job] option `{key}`"));
            continue;
        }
        let value = match meta {
            Meta::NameValue(nv) => nv.value,
            Meta::Path(_) | Meta::List(_) => {
                errors.spanned(&meta, format!("expected `{key} = {}`", example_value(&key)));
                continue;
            }
        };
        if let Err(e) = apply(&mut options, &ident, &value) {
            errors.push(e);
        }
    }
    options
}

/// Validates one `key = value` and stores it.
fn apply(options: &mut JobOptions, key: &Ident, value: &Expr) -> syn::Result<()> {
    match key.to_string().as_str() {
        "queue" => {
            let lit = string_literal(key, value)?;
            options.queue = Some(validate_queue(&lit)?);
        }
        "name" => {
            let lit = string_literal(key, value)?;
            options.name = Some(validate_name(&lit)?);
        }
        "timeout" => {
            let lit = string_literal(key, value)?;
            let millis = duration::parse_millis(&lit.value())
                .map_err(|message| syn::Error::new(lit.span(), message))?;
            options.timeout_ms = Some(millis);
        }
        "deadline" => {
            let lit = string_literal(key, value)?;
            let millis = duration::parse_millis(&lit.value()).map_err(|message| {
                syn::Error::new(lit.span(), message.replace("timeout", "deadline"))
            })?;
            options.deadline_ms = Some(millis);
        }
        "max_attempts" => options.max_attempts = Some(positive_u32(key, value)?),
        "version" => options.version = Some(positive_u32(key, value)?),
        "cron" => {
            let lit = string_literal(key, value)?;
            options.cron = Some(SpannedValue {
                value: validate_cron(&lit)?,
                span: lit.span(),
            });
        }
        "rate_key" => options.rate_key = Some(field_path(key, value)?),
        other => unreachable!("option `{other}` is in KNOWN but not handled"),
    }
    Ok(())
}

/// Looks through invisible groups and parentheses (e.g. a `$lit:literal`
/// forwarded by a `macro_rules!` macro).
fn strip(value: &Expr) -> &Expr {
    match value {
        Expr::Group(g) => strip(&g.expr),
        Expr::Paren(p) => strip(&p.expr),
        other => other,
    }
}

fn string_literal(key: &Ident, value: &Expr) -> syn::Result<LitStr> {
    if let Expr::Lit(lit) = strip(value) {
        if let Lit::Str(s) = &lit.lit {
            return Ok(s.clone());
        }
    }
    Err(syn::Error::new_spanned(
        value,
        format!(
            "`{key}` expects a string literal, e.g. `{key} = {}`",
            example_value(&key.to_string())
        ),
    ))
}

fn positive_u32(key: &Ident, value: &Expr) -> syn::Result<u32> {
    let example = example_value(&key.to_string());
    match strip(value) {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(int) => {
                if !matches!(int.suffix(), "" | "u32") {
                    return Err(syn::Error::new(
                        int.span(),
                        format!("`{key}` is a u32: drop the `{}` suffix", int.suffix()),
                    ));
                }
                if int.base10_digits().starts_with('-') {
                    return Err(syn::Error::new(
                        int.span(),
                        format!("`{key}` must be at least 1"),
                    ));
                }
                let n: u32 = int.base10_parse().map_err(|_| {
                    syn::Error::new(int.span(), format!("`{key}` must fit in a u32"))
                })?;
                if n == 0 {
                    return Err(syn::Error::new(
                        int.span(),
                        format!("`{key}` must be at least 1"),
                    ));
                }
                Ok(n)
            }
            _ => Err(syn::Error::new_spanned(
                value,
                format!("`{key}` expects an integer literal, e.g. `{key} = {example}`"),
            )),
        },
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => Err(syn::Error::new_spanned(
            value,
            format!("`{key}` must be at least 1"),
        )),
        _ => Err(syn::Error::new_spanned(
            value,
            format!("`{key}` expects an integer literal, e.g. `{key} = {example}`"),
        )),
    }
}

/// Queue names end up inside Redis hash tags (`q:{<queue>}:main`), so braces
/// would break the key layout; whitespace and control characters are
/// almost certainly typos. The same rule as `queue_core::validate_queue_name`,
/// which enqueues apply at run time (this crate cannot call it: queue-core
/// depends on it); `the_queue_name_rule_is_queue_cores` keeps them equal.
fn validate_queue(lit: &LitStr) -> syn::Result<String> {
    let queue = lit.value();
    let problem = if queue.is_empty() {
        Some("must not be empty")
    } else if queue.contains(['{', '}']) {
        Some("must not contain `{` or `}` (queue names become Redis hash tags)")
    } else if queue.chars().any(char::is_whitespace) {
        Some("must not contain whitespace")
    } else if queue.chars().any(char::is_control) {
        Some("must not contain control characters")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(syn::Error::new(
            lit.span(),
            format!("invalid queue name {queue:?}: a queue name {problem}"),
        )),
        None => Ok(queue),
    }
}

fn validate_name(lit: &LitStr) -> syn::Result<String> {
    let name = lit.value();
    if name.trim().is_empty() {
        return Err(syn::Error::new(lit.span(), "job name must not be empty"));
    }
    if name.chars().any(char::is_control) {
        return Err(syn::Error::new(
            lit.span(),
            format!("invalid job name {name:?}: control characters are not allowed"),
        ));
    }
    Ok(name)
}

fn example_value(key: &str) -> &'static str {
    match key {
        "queue" => "\"emails\"",
        "max_attempts" => "5",
        "timeout" => "\"30s\"",
        "name" => "\"send_welcome\"",
        "version" => "2",
        "cron" => "\"0 */5 * * * *\"",
        "rate_key" => "tenant",
        "deadline" => "\"5m\"",
        _ => "...",
    }
}

fn unknown_option_message(key: &str) -> String {
    let mut message = format!(
        "unknown #[job] option `{key}`; expected one of: {}",
        KNOWN.join(", ")
    );
    let closest = KNOWN
        .iter()
        .map(|known| (edit_distance(key, known), *known))
        .min()
        .filter(|(distance, _)| *distance <= 2.max(key.len() / 3));
    if let Some((_, known)) = closest {
        message.push_str(&format!(" (did you mean `{known}`?)"));
    }
    message
}

/// Levenshtein distance, for "did you mean" hints.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// The cron expression, parsed with the same `cron` crate (and version,
/// Cargo.lock) as queue-core's scheduler, so the attribute accepts exactly
/// what `Worker::build()` accepts: `"0 0 25 * * *"` is refused here rather
/// than at deploy, and `"@daily"` is accepted.
fn validate_cron(lit: &LitStr) -> syn::Result<String> {
    let expr = lit.value();
    match cron::Schedule::from_str(&expr) {
        // A schedule no date matches (`"0 0 0 30 2 *"`: the 30th of
        // February) parses, and the job would never run, without a word. One
        // whose dates are past is not refused: whether code compiles must
        // not depend on the day it is compiled.
        Ok(schedule)
            if schedule
                .after(&chrono::DateTime::<chrono::Utc>::UNIX_EPOCH)
                .next()
                .is_none() =>
        {
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "cron expression {expr:?} never fires: no date matches it \
                     (a day the month does not have?)"
                ),
            ))
        }
        Ok(_) => Ok(expr),
        Err(e) => {
            // The crate's message may quote the expression with a caret line
            // under it; the reason is its last line with words, if any.
            let e = e.to_string();
            let reason = e
                .lines()
                .map(str::trim)
                .rev()
                .find(|l| l.chars().any(char::is_alphabetic) && *l != expr.trim())
                .unwrap_or("not a cron expression");
            let fields = expr.split_whitespace().count();
            let found = if expr.trim_start().starts_with('@') || (6..=7).contains(&fields) {
                String::new()
            } else {
                format!(" (found {fields} fields)")
            };
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "invalid cron expression {expr:?}: {reason}; `cron` expects 6 fields with seconds \
                     (sec min hour day month weekday, and an optional year), e.g. \"0 */5 * * * *\", \
                     or @yearly, @monthly, @weekly, @daily, @hourly{found}"
                ),
            ))
        }
    }
}

/// `rate_key = tenant` or `rate_key = customer.id`: a field (path) of the
/// args, as tokens that keep their spans.
fn field_path(key: &Ident, value: &Expr) -> syn::Result<FieldPath> {
    /// The path's tokens without invisible groups or parentheses.
    fn tokens(e: &Expr) -> Option<TokenStream> {
        match strip(e) {
            Expr::Path(p) if p.qself.is_none() => p.path.get_ident().map(|ident| quote!(#ident)),
            Expr::Field(f) => {
                let base = tokens(&f.base)?;
                let (dot, member) = (&f.dot_token, &f.member);
                Some(quote!(#base #dot #member))
            }
            _ => None,
        }
    }
    if let Some(tokens) = tokens(value) {
        let span = tokens
            .clone()
            .into_iter()
            .next()
            .map_or_else(Span::call_site, |t| t.span());
        return Ok(FieldPath { tokens, span });
    }
    Err(syn::Error::new_spanned(
        value,
        format!("`{key}` expects a field of the job's args, e.g. `rate_key = tenant` or `rate_key = customer.id`"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(tokens: TokenStream) -> JobOptions {
        let mut errors = Errors::default();
        let options = parse(tokens, &mut errors);
        assert!(
            errors.is_empty(),
            "unexpected errors: {:?}",
            errors.messages()
        );
        options
    }

    fn parse_err(tokens: TokenStream) -> (JobOptions, Vec<String>) {
        let mut errors = Errors::default();
        let options = parse(tokens, &mut errors);
        assert!(!errors.is_empty(), "expected an error");
        (options, errors.messages())
    }

    #[test]
    fn empty_means_defaults() {
        assert_eq!(parse_ok(quote!()), JobOptions::default());
    }

    #[test]
    fn all_options() {
        let options = parse_ok(quote!(
            queue = "emails",
            max_attempts = 5,
            timeout = "30s",
            name = "welcome",
            version = 3,
        ));
        assert_eq!(
            options,
            JobOptions {
                queue: Some("emails".into()),
                max_attempts: Some(5),
                timeout_ms: Some(30_000),
                name: Some("welcome".into()),
                version: Some(3),
                cron: None,
                rate_key: None,
                deadline_ms: None,
            }
        );
    }

    #[test]
    fn rate_key_takes_a_field_path_of_the_args() {
        let text = |tokens| parse_ok(tokens).rate_key.map(|p| p.text());
        assert_eq!(
            text(quote!(rate_key = customer.id)).as_deref(),
            Some("customer . id")
        );
        assert_eq!(text(quote!(rate_key = tenant)).as_deref(), Some("tenant"));
        assert_eq!(
            text(quote!(rate_key = (pair.0))).as_deref(),
            Some("pair . 0")
        );
        let (_, messages) = parse_err(quote!(rate_key = "tenant"));
        assert!(
            messages[0].contains("expects a field of the job's args"),
            "{messages:?}"
        );
    }

    #[test]
    fn u32_suffix_is_accepted() {
        assert_eq!(parse_ok(quote!(max_attempts = 7u32)).max_attempts, Some(7));
    }

    #[test]
    fn unknown_option_lists_known_ones_and_suggests() {
        let (_, messages) = parse_err(quote!(max_attempt = 5));
        assert_eq!(
            messages,
            ["unknown #[job] option `max_attempt`; expected one of: queue, max_attempts, timeout, name, version, cron, rate_key, deadline (did you mean `max_attempts`?)"]
        );
        let (_, messages) = parse_err(quote!(priority = 5));
        assert!(!messages[0].contains("did you mean"), "{messages:?}");
    }

    #[test]
    fn duplicate_option() {
        let (options, messages) = parse_err(quote!(queue = "a", queue = "b"));
        assert_eq!(messages, ["duplicate #[job] option `queue`"]);
        assert_eq!(options.queue.as_deref(), Some("a"));
    }

    #[test]
    fn wrong_literal_types() {
        let (_, m) = parse_err(quote!(queue = 5));
        assert_eq!(
            m,
            ["`queue` expects a string literal, e.g. `queue = \"emails\"`"]
        );
        let (_, m) = parse_err(quote!(max_attempts = "5"));
        assert_eq!(
            m,
            ["`max_attempts` expects an integer literal, e.g. `max_attempts = 5`"]
        );
        let (_, m) = parse_err(quote!(timeout = 30));
        assert_eq!(
            m,
            ["`timeout` expects a string literal, e.g. `timeout = \"30s\"`"]
        );
        let (_, m) = parse_err(quote!(version = SOME_CONST));
        assert_eq!(
            m,
            ["`version` expects an integer literal, e.g. `version = 2`"]
        );
        let (_, m) = parse_err(quote!(max_attempts = 5u8));
        assert_eq!(m, ["`max_attempts` is a u32: drop the `u8` suffix"]);
    }

    #[test]
    fn numeric_ranges() {
        let (_, m) = parse_err(quote!(max_attempts = 0));
        assert_eq!(m, ["`max_attempts` must be at least 1"]);
        let (_, m) = parse_err(quote!(version = 0));
        assert_eq!(m, ["`version` must be at least 1"]);
        let (_, m) = parse_err(quote!(max_attempts = -3));
        assert_eq!(m, ["`max_attempts` must be at least 1"]);
        let (_, m) = parse_err(quote!(max_attempts = 4294967296));
        assert_eq!(m, ["`max_attempts` must fit in a u32"]);
        assert_eq!(
            parse_ok(quote!(version = 4294967295)).version,
            Some(u32::MAX)
        );
    }

    #[test]
    fn queue_names() {
        for bad in ["", "a b", "a{b", "}", "tab\there"] {
            let (_, m) = parse_err(quote!(queue = #bad));
            assert!(m[0].starts_with("invalid queue name"), "{bad:?}: {m:?}");
        }
        assert_eq!(
            parse_ok(quote!(queue = "emails:high.v2")).queue.as_deref(),
            Some("emails:high.v2")
        );
    }

    #[test]
    fn job_names() {
        let (_, m) = parse_err(quote!(name = ""));
        assert_eq!(m, ["job name must not be empty"]);
        let (_, m) = parse_err(quote!(name = "a\nb"));
        assert!(m[0].contains("control characters"), "{m:?}");
    }

    #[test]
    fn bad_timeout_is_reported_and_other_options_kept() {
        let (options, m) = parse_err(quote!(queue = "q", timeout = "0s", max_attempts = 2));
        assert_eq!(m.len(), 1);
        assert!(m[0].contains("is zero"), "{m:?}");
        assert_eq!(options.queue.as_deref(), Some("q"));
        assert_eq!(options.max_attempts, Some(2));
        assert_eq!(options.timeout_ms, None);
    }

    #[test]
    fn every_error_is_reported() {
        let (_, m) = parse_err(quote!(queue = "", max_attempts = 0, colour = "red"));
        assert_eq!(m.len(), 3, "{m:?}");
    }

    #[test]
    fn flag_and_list_forms_are_rejected() {
        let (_, m) = parse_err(quote!(queue));
        assert_eq!(m, ["expected `queue = \"emails\"`"]);
        let (_, m) = parse_err(quote!(timeout("30s")));
        assert_eq!(m, ["expected `timeout = \"30s\"`"]);
        let (_, m) = parse_err(quote!(a::b = 1));
        assert!(m[0].starts_with("expected a #[job] option name"), "{m:?}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let (_, m) = parse_err(quote!(queue = ));
        assert_eq!(m.len(), 1);
    }

    /// The attribute refuses and accepts what queue-core's scheduler does
    /// (the same `cron` crate): an hour of 25 is an error here, not at
    /// `Worker::build()`; `@daily` is accepted. Before, only the fields were
    /// counted.
    #[test]
    fn cron_expressions_are_parsed_like_the_scheduler_does() {
        let (options, m) = parse_err(quote!(cron = "0 0 25 * * *"));
        assert_eq!(options.cron, None);
        assert!(
            m[0].starts_with("invalid cron expression \"0 0 25 * * *\": Hours must be less than"),
            "{m:?}"
        );
        let (_, m) = parse_err(quote!(cron = "*/5 * * * *"));
        assert!(
            m[0].starts_with("invalid cron expression \"*/5 * * * *\": not a cron expression;")
                && m[0].ends_with("(found 5 fields)"),
            "{m:?}"
        );
        for ok in [
            "@daily",
            "@hourly",
            "0 */5 * * * *",
            "0 0 3 * * Mon-Fri",
            "0 0 0 1 1 * 2099",
            "0 0 0 1 1 * 2020",
        ] {
            assert_eq!(
                parse_ok(quote!(cron = #ok))
                    .cron
                    .map(|c| c.value)
                    .as_deref(),
                Some(ok)
            );
            assert!(cron::Schedule::from_str(ok).is_ok(), "{ok}");
        }
    }

    /// A schedule that parses but matches no date is refused at the
    /// attribute: before, the job built and never ran. One whose dates are
    /// past compiles (compiling must not depend on the day).
    #[test]
    fn a_cron_expression_that_never_fires_is_refused() {
        for never in ["0 0 0 30 2 *", "0 0 0 31 4 *"] {
            let (options, m) = parse_err(quote!(cron = #never));
            assert_eq!(options.cron, None, "{never}");
            assert!(
                m[0].starts_with(&format!("cron expression {never:?} never fires")),
                "{m:?}"
            );
        }
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("queue", "queue"), 0);
        assert_eq!(edit_distance("queu", "queue"), 1);
        assert_eq!(edit_distance("timout", "timeout"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}

#[cfg(test)]
mod queue_name_tests {
    use super::validate_queue;

    /// The attribute refuses exactly the names (and with the same words)
    /// that queue-core's enqueues refuse at run time.
    #[test]
    fn the_queue_name_rule_is_queue_cores() {
        let names = [
            "emails",
            "",
            "}x",
            "{x",
            "a}:job:x",
            "a b",
            "a\tb",
            "a\u{7}b",
            "é-ü_1.2:3",
        ];
        for name in names {
            let lit = syn::LitStr::new(name, proc_macro2::Span::call_site());
            let attribute = validate_queue(&lit).map(drop).map_err(|e| e.to_string());
            let run_time = queue_core::validate_queue_name(name)
                .map_err(|p| format!("invalid queue name {name:?}: a queue name {p}"));
            assert_eq!(attribute, run_time, "{name:?}");
        }
    }
}
