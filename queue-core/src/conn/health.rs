//! What a reply says about the server a connection talks to: fine, broken
//! (I/O error, timeout: the command may have run) or demoted (`READONLY`:
//! the server is a replica now and the command did not run). Shared by the
//! Sentinel connection (which re-resolves the primary) and the single-server
//! one (which connects again to the URL's host).

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

/// What a reply says about the server (the primary, as far as we knew) we used.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Health {
    Fine,
    /// I/O error or timeout: the command may have run. Reconnect for the next one.
    Broken,
    /// `READONLY`: the node is a replica now; the command did not run.
    Demoted,
}

pub(super) fn is_readonly_value(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::ReadOnly))
}

pub(super) fn health_of_error(e: &RedisError) -> Health {
    if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
        Health::Demoted
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::MasterDown)
    {
        Health::Broken
    } else if let Some(errs) = e.clone().into_server_errors() {
        if errs
            .iter()
            .any(|(_, se)| se.kind() == Some(ServerErrorKind::ReadOnly))
        {
            Health::Demoted
        } else {
            Health::Fine
        }
    } else {
        Health::Fine
    }
}

pub(super) fn health_of<T>(res: &RedisResult<T>, is_readonly: impl Fn(&T) -> bool) -> Health {
    match res {
        Ok(v) if is_readonly(v) => Health::Demoted,
        Ok(_) => Health::Fine,
        Err(e) => health_of_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readonly_and_io_errors_mark_the_primary() {
        let ro = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert_eq!(health_of_error(&ro), Health::Demoted);
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(health_of_error(&io), Health::Broken);
        let other = RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "ERR x"));
        assert_eq!(health_of_error(&other), Health::Fine);
    }
}
