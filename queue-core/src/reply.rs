//! Reading script replies without panicking on anything Redis sends.

use redis::Value;

/// The text of a bulk/simple string or integer reply.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".to_string()),
        _ => None,
    }
}

/// Raw bytes of a string reply.
pub(crate) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// An integer, whether sent as integer or as decimal text.
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

/// The elements of an array reply.
pub(crate) fn array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(items),
        Value::Nil => Some(&[]),
        _ => None,
    }
}
