//! Hand-rolled `--flag value` parsing (no CLI dependency).

use std::collections::HashMap;
use std::str::FromStr;

/// Parsed flags: `--name value` pairs and boolean `--name` switches.
#[derive(Debug, Default)]
pub struct Args {
    values: HashMap<String, String>,
    switches: Vec<String>,
}

impl Args {
    /// Parses `argv` (without the program name and mode). `switches` lists
    /// the flags that take no value.
    pub fn parse(argv: &[String], switches: &[&str], valued: &[&str]) -> Result<Args, String> {
        let mut args = Args::default();
        let mut it = argv.iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument `{a}`"));
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (name, None),
            };
            if switches.contains(&name) {
                if inline.is_some() {
                    return Err(format!("--{name} takes no value"));
                }
                args.switches.push(name.to_string());
            } else if valued.contains(&name) {
                let value = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("--{name} needs a value"))?,
                };
                args.values.insert(name.to_string(), value);
            } else {
                return Err(format!("unknown flag --{name}"));
            }
        }
        Ok(args)
    }

    pub fn switch(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }

    pub fn string(&self, name: &str) -> Option<String> {
        self.values.get(name).cloned()
    }

    pub fn get<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name}: cannot parse `{v}`")),
        }
    }
}
