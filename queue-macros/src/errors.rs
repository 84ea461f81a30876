//! Collecting several `syn::Error`s so one compile reports every problem.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

/// Accumulates errors; each one becomes a `compile_error!` at its own span.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Records `error`.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// Moves every error of `other` into `self`.
    pub(crate) fn append(&mut self, other: Errors) {
        if let Some(e) = other.0 {
            self.push(e);
        }
    }

    /// Records an error pointing at `span`.
    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Records an error covering all of `tokens`.
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Whether nothing was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The `compile_error!` invocations (empty when there are no errors).
    pub(crate) fn to_compile_errors(&self) -> TokenStream {
        self.0
            .as_ref()
            .map(syn::Error::to_compile_error)
            .unwrap_or_default()
    }

    /// The messages, in order (for unit tests).
    #[cfg(test)]
    pub(crate) fn messages(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|e| e.clone().into_iter())
            .map(|e| e.to_string())
            .collect()
    }
}
