//! Completion records (`q:{Q}:done:<id>`) in their two forms: a hash, or the
//! compact string an ack writes with [`WorkerConfig::compact_records`]:
//!
//! ```text
//! c1 <finished_at> <attempts> <enqueued_at> <delivered_at> <#token>:<#type>:<#worker>:<token><type><worker><result>
//! ```
//!
//! (the four times and counts in decimal, the lengths of the three strings
//! that follow, the result reference as the rest; its status is `done`).
//! Written by `ack.lua`; read in Lua by `record_all` / `record_field` of
//! `scripts/prelude.lua`, in Rust by [`unpack`] (through `Queue::completion`).
//!
//! [`WorkerConfig::compact_records`]: crate::WorkerConfig::compact_records

/// The `(field, value)` pairs of a compact record, `status` `done` first and
/// `result` left out when empty (a hash record has none then). A string that
/// does not parse gives `status` alone: the record still says that the job
/// finished.
pub(crate) fn unpack(s: &[u8]) -> Vec<(String, Vec<u8>)> {
    parse(s).unwrap_or_else(|| vec![("status".to_string(), b"done".to_vec())])
}

fn parse(s: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut rest = s.strip_prefix(b"c1 ")?;
    let mut out = vec![("status".to_string(), b"done".to_vec())];
    for name in ["finished_at", "attempts", "enqueued_at", "delivered_at"] {
        out.push((name.to_string(), digits(&mut rest, b' ')?.to_vec()));
    }
    let mut lengths = [0usize; 3];
    for len in &mut lengths {
        *len = std::str::from_utf8(digits(&mut rest, b':')?)
            .ok()?
            .parse()
            .ok()?;
    }
    for (name, len) in ["token", "type", "worker"].into_iter().zip(lengths) {
        let value = rest.get(..len)?;
        out.push((name.to_string(), value.to_vec()));
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        out.push(("result".to_string(), rest.to_vec()));
    }
    Some(out)
}

/// The decimal digits at the start of `rest`, up to `end`, which is
/// consumed with them; `None` when there are none or another byte comes first.
fn digits<'a>(rest: &mut &'a [u8], end: u8) -> Option<&'a [u8]> {
    let at = rest.iter().position(|b| *b == end)?;
    let (number, tail) = (&rest[..at], &rest[at + 1..]);
    if number.is_empty() || !number.iter().all(u8::is_ascii_digit) {
        return None;
    }
    *rest = tail;
    Some(number)
}

#[cfg(test)]
mod tests {
    use super::unpack;

    fn text(pairs: Vec<(String, Vec<u8>)>) -> Vec<(String, String)> {
        pairs
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_compact_record_reads_as_the_fields_of_a_hash_record() {
        let s = b"c1 1733400000123 2 1733399999000 1733400000100 6:4:2:tok:17mailw1";
        assert_eq!(
            text(unpack(s)),
            pairs(&[
                ("status", "done"),
                ("finished_at", "1733400000123"),
                ("attempts", "2"),
                ("enqueued_at", "1733399999000"),
                ("delivered_at", "1733400000100"),
                ("token", "tok:17"),
                ("type", "mail"),
                ("worker", "w1"),
            ]),
            "an empty result is left out"
        );
    }

    #[test]
    fn the_strings_may_hold_any_byte_the_lengths_say_where_they_end() {
        let s = b"c1 5 1 0 0 4:4:0:a:b:t y \x00:\x01";
        let got = unpack(s);
        assert_eq!(got[5], ("token".into(), b"a:b:".to_vec()));
        assert_eq!(got[6], ("type".into(), b"t y ".to_vec()));
        assert_eq!(got[7], ("worker".into(), b"".to_vec()));
        assert_eq!(got[8], ("result".into(), b"\x00:\x01".to_vec()));
    }

    #[test]
    fn a_string_that_does_not_parse_still_says_done() {
        let bad: [&[u8]; 7] = [
            b"",
            b"done",
            b"c1 ",
            b"c1 1 2 3 4 9:0:0:short",
            b"c1 1 x 3 4 0:0:0:",
            b"c1 1 2 3 4 -1:0:0:",
            b"c1 1 2 3 0:0:0:",
        ];
        for s in bad {
            assert_eq!(
                text(unpack(s)),
                pairs(&[("status", "done")]),
                "{:?}",
                String::from_utf8_lossy(s)
            );
        }
    }
}
