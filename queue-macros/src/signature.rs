//! Validation of the handler's signature:
//! `async fn name(ctx: JobContext, args: Args) -> Result<(), JobError>` (or
//! `Result<T, JobError>`: the value is stored for the completion record).

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{FnArg, GenericArgument, PathArguments, ReturnType, Signature, Type};

use crate::errors::Errors;

/// What code generation needs from a valid handler signature.
pub(crate) struct JobSignature {
    /// The type of the first argument (a `JobContext`).
    pub(crate) ctx_ty: Type,
    /// The type of the second argument: the job's payload, `Job::Args`.
    pub(crate) args_ty: Type,
    /// The span of the declared return type.
    pub(crate) output_span: Span,
    /// The declared return type.
    pub(crate) output_ty: Option<Type>,
}

const SHAPE: &str = "`async fn name(ctx: JobContext, args: YourArgs) -> Result<(), JobError>`";

/// Checks `sig`, recording every problem in `errors`. Returns `None` when
/// anything was wrong.
pub(crate) fn validate(sig: &Signature, errors: &mut Errors) -> Option<JobSignature> {
    let mut problems = Errors::default();

    if sig.asyncness.is_none() {
        problems.push(syn::Error::new(
            sig.fn_token.span,
            "#[job] functions must be `async fn`",
        ));
    }
    if let Some(unsafety) = &sig.unsafety {
        problems.push(syn::Error::new(
            unsafety.span,
            "#[job] functions cannot be `unsafe`",
        ));
    }
    if let Some(abi) = &sig.abi {
        problems.push(syn::Error::new_spanned(
            abi,
            "#[job] functions cannot have an `extern` ABI",
        ));
    }
    if !sig.generics.params.is_empty() {
        problems.push(syn::Error::new_spanned(
            &sig.generics,
            "#[job] functions cannot be generic: the job's argument type must be a concrete type",
        ));
    } else if let Some(where_clause) = &sig.generics.where_clause {
        problems.push(syn::Error::new_spanned(
            where_clause,
            "#[job] functions cannot have a `where` clause",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        problems.push(syn::Error::new_spanned(
            variadic,
            "#[job] functions cannot be variadic",
        ));
    }

    let mut typed = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => problems.push(syn::Error::new_spanned(
                receiver,
                format!("#[job] cannot be used on methods: write a free function, {SHAPE}"),
            )),
            FnArg::Typed(pat_type) => typed.push(&*pat_type.ty),
        }
    }

    let count = sig.inputs.len();
    if count < 2 {
        problems.push(syn::Error::new(
            sig.paren_token.span.join(),
            format!("#[job] functions take exactly 2 arguments, {SHAPE}; found {count}"),
        ));
    } else if count > 2 {
        let extra: Vec<_> = sig.inputs.iter().skip(2).collect();
        problems.push(syn::Error::new_spanned(
            quote::quote!(#(#extra),*),
            format!("#[job] functions take exactly 2 arguments, {SHAPE}; found {count}"),
        ));
    }

    let ctx_ty = match sig.inputs.first() {
        Some(FnArg::Typed(arg)) => {
            if let Err(e) = check_context(&arg.ty) {
                problems.push(e);
            }
            Some((*arg.ty).clone())
        }
        _ => None,
    };
    let args_ty = match sig.inputs.iter().nth(1) {
        Some(FnArg::Typed(arg)) => {
            if let Err(e) = check_owned(&arg.ty) {
                problems.push(e);
            }
            Some((*arg.ty).clone())
        }
        _ => None,
    };

    let output_span = match &sig.output {
        ReturnType::Type(_, ty) => Some(ty.span()),
        ReturnType::Default => {
            problems.push(syn::Error::new(
                sig.ident.span(),
                "#[job] functions must return `Result<(), JobError>` (or `Result<T, JobError>` to store a value)",
            ));
            None
        }
    };

    let ok = problems.is_empty();
    errors.append(problems);
    match (ok, ctx_ty, args_ty, output_span) {
        (true, Some(ctx_ty), Some(args_ty), Some(output_span)) => Some(JobSignature {
            ctx_ty,
            args_ty,
            output_span,
            output_ty: match &sig.output {
                ReturnType::Type(_, ty) => Some((**ty).clone()),
                ReturnType::Default => None,
            },
        }),
        _ => None,
    }
}

/// Looks through parentheses and invisible groups.
pub(crate) fn strip(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => strip(&g.elem),
        Type::Paren(p) => strip(&p.elem),
        other => other,
    }
}

/// The first argument must be a `JobContext`, taken by value.
fn check_context(ty: &Type) -> syn::Result<()> {
    match strip(ty) {
        Type::Path(p)
            if p.qself.is_none()
                && p.path.segments.last().is_some_and(|s| {
                    s.ident == "JobContext" && matches!(s.arguments, PathArguments::None)
                }) =>
        {
            Ok(())
        }
        Type::Reference(r) if is_context(&r.elem) => Err(syn::Error::new_spanned(
            ty,
            "take the context by value: `ctx: JobContext` (it is cheap to clone)",
        )),
        _ => Err(syn::Error::new_spanned(
            ty,
            format!("the first argument of a #[job] function must be `JobContext`, as in {SHAPE}"),
        )),
    }
}

fn is_context(ty: &Type) -> bool {
    matches!(strip(ty), Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "JobContext"))
}

/// The second argument is decoded from the stored payload, so it must be an
/// owned, `'static`, concrete type.
fn check_owned(ty: &Type) -> syn::Result<()> {
    const OWNED: &str =
        "the job arguments must be an owned type (it is decoded from the stored payload)";
    match ty {
        Type::Reference(_) => Err(syn::Error::new_spanned(
            ty,
            format!("{OWNED}: references are not allowed, use e.g. `String` instead of `&str`"),
        )),
        Type::ImplTrait(_) => Err(syn::Error::new_spanned(
            ty,
            format!("{OWNED}: `impl Trait` is not allowed, name a concrete type"),
        )),
        Type::TraitObject(_) => Err(syn::Error::new_spanned(
            ty,
            format!("{OWNED}: trait objects are not allowed, name a concrete type"),
        )),
        Type::Infer(_) => Err(syn::Error::new_spanned(
            ty,
            format!("{OWNED}: name the type explicitly"),
        )),
        Type::Group(g) => check_owned(&g.elem),
        Type::Paren(p) => check_owned(&p.elem),
        Type::Array(a) => check_owned(&a.elem),
        Type::Slice(s) => check_owned(&s.elem),
        Type::Tuple(t) => t.elems.iter().try_for_each(check_owned),
        Type::Path(p) => {
            if let Some(qself) = &p.qself {
                check_owned(&qself.ty)?;
            }
            for segment in &p.path.segments {
                let PathArguments::AngleBracketed(args) = &segment.arguments else {
                    continue;
                };
                for arg in &args.args {
                    match arg {
                        GenericArgument::Type(t) => check_owned(t)?,
                        GenericArgument::AssocType(a) => check_owned(&a.ty)?,
                        GenericArgument::Lifetime(l) if l.ident != "static" => {
                            return Err(syn::Error::new_spanned(
                                l,
                                format!(
                                    "{OWNED}: borrowed data (lifetime `{}`) is not allowed",
                                    l.to_token_stream()
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn check(sig: Signature) -> (Option<JobSignature>, Vec<String>) {
        let mut errors = Errors::default();
        let result = validate(&sig, &mut errors);
        (result, errors.messages())
    }

    #[test]
    fn accepts_the_canonical_shape() {
        let (sig, errors) = check(parse_quote!(
            async fn send_welcome(ctx: JobContext, args: Welcome) -> Result<(), JobError>
        ));
        assert!(errors.is_empty(), "{errors:?}");
        let sig = sig.unwrap();
        assert_eq!(sig.args_ty.to_token_stream().to_string(), "Welcome");
        assert_eq!(sig.ctx_ty.to_token_stream().to_string(), "JobContext");
    }

    #[test]
    fn accepts_paths_patterns_and_owned_generics() {
        let (sig, errors) = check(parse_quote!(
            async fn f(
                _ctx: queue_core::JobContext,
                mut args: std::collections::HashMap<String, Vec<(u8, Cow<'static, str>)>>,
            ) -> JobResult
        ));
        assert!(errors.is_empty(), "{errors:?}");
        assert!(sig.is_some());
    }

    #[test]
    fn not_async() {
        let (sig, errors) = check(parse_quote!(fn f(ctx: JobContext, a: A) -> R));
        assert!(sig.is_none());
        assert_eq!(errors, ["#[job] functions must be `async fn`"]);
    }

    #[test]
    fn generics_receiver_and_where_clause() {
        let (_, errors) = check(parse_quote!(async fn f<T>(ctx: JobContext, a: T) -> R));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("cannot be generic"));
        let (_, errors) = check(parse_quote!(async fn f<'a>(ctx: JobContext, a: A) -> R));
        assert!(errors[0].contains("cannot be generic"));
        let (_, errors) = check(parse_quote!(async fn f(ctx: JobContext, a: A) -> R where A: Copy));
        assert!(errors[0].contains("`where` clause"));
        let (_, errors) = check(parse_quote!(async fn f(&self, a: A) -> R));
        assert!(
            errors[0].contains("cannot be used on methods"),
            "{errors:?}"
        );
    }

    #[test]
    fn argument_count() {
        for sig in [
            parse_quote!(async fn f() -> R),
            parse_quote!(async fn f(ctx: JobContext) -> R),
            parse_quote!(async fn f(ctx: JobContext, a: A, b: B) -> R),
        ] {
            let (result, errors) = check(sig);
            assert!(result.is_none());
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].contains("exactly 2 arguments"), "{errors:?}");
        }
    }

    #[test]
    fn context_type() {
        let (_, errors) = check(parse_quote!(async fn f(ctx: String, a: A) -> R));
        assert!(
            errors[0].starts_with("the first argument of a #[job] function must be `JobContext`")
        );
        let (_, errors) = check(parse_quote!(async fn f(ctx: &JobContext, a: A) -> R));
        assert!(
            errors[0].starts_with("take the context by value"),
            "{errors:?}"
        );
        let (_, errors) = check(parse_quote!(async fn f(ctx: JobContext<X>, a: A) -> R));
        assert_eq!(errors.len(), 1);
    }

    #[test]
    fn owned_arguments() {
        let bad: [Type; 7] = [
            parse_quote!(&Welcome),
            parse_quote!(&'static str),
            parse_quote!(impl Serialize),
            parse_quote!(Vec<&str>),
            parse_quote!(Cow<'_, str>),
            parse_quote!((u8, &[u8])),
            parse_quote!(_),
        ];
        for ty in bad {
            let shown = ty.to_token_stream().to_string();
            assert!(check_owned(&ty).is_err(), "{shown} was accepted");
        }
        let good: [Type; 5] = [
            parse_quote!(Welcome),
            parse_quote!(()),
            parse_quote!([u8; 4]),
            parse_quote!(Option<Box<Welcome>>),
            parse_quote!(<T as Trait>::Assoc),
        ];
        for ty in good {
            let shown = ty.to_token_stream().to_string();
            assert!(check_owned(&ty).is_ok(), "{shown} was rejected");
        }
    }

    #[test]
    fn missing_return_type() {
        let (sig, errors) = check(parse_quote!(async fn f(ctx: JobContext, a: A)));
        assert!(sig.is_none());
        assert_eq!(
            errors,
            ["#[job] functions must return `Result<(), JobError>` (or `Result<T, JobError>` to store a value)"]
        );
    }

    #[test]
    fn reports_every_problem() {
        let (_, errors) = check(parse_quote!(fn f(ctx: u8, a: &A)));
        assert_eq!(errors.len(), 4, "{errors:?}");
    }
}
